//! The change log's entries: what one commit did to the tree, as node images.
//!
//! A commit appends one row to `changes` holding, for every node it changed, the node's new
//! image (or its deletion) and whether the node existed before. That row is the durable record:
//! the `nodes` table is brought up to date later, in bulk, by [`Coalesced`] (many commits'
//! images folded into one write per node; a node created and deleted between two
//! materializations never reaches the table). Handles in other processes fold the images into
//! their memory directly.
//!
//! Encoding (little-endian): a format byte, then per entry `u32` path length, the path, a flag
//! byte (bit 0: present after the commit, bit 1: existed before), and for a present node
//! `i32` version, `u64` owner, `u64` ctime, `u64` mtime, `i64` seq, and the data as a presence
//! byte followed by `u32` length and bytes.

use crate::mem::MemNode;
use foldhash::HashMap;

const FORMAT: u8 = 1;
const PRESENT: u8 = 1;
const EXISTED: u8 = 2;

/// One node's change in a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    /// The node after the commit; `None`: deleted.
    pub node: Option<MemNode>,
    /// Whether the node existed before the commit.
    pub existed: bool,
}

/// Encodes a commit's changes.
#[cfg(test)]
pub fn encode<'a>(
    entries: impl IntoIterator<Item = (&'a str, Option<&'a MemNode>, bool)>,
) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, entries);
    out
}

/// [`encode`] into `out` (cleared first), so a writer can keep one buffer: a fresh one per
/// commit cost page faults and regrowth copies.
pub fn encode_into<'a>(
    out: &mut Vec<u8>,
    entries: impl IntoIterator<Item = (&'a str, Option<&'a MemNode>, bool)>,
) {
    out.clear();
    out.push(FORMAT);
    for (path, node, existed) in entries {
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path.as_bytes());
        let flags = if node.is_some() { PRESENT } else { 0 } | if existed { EXISTED } else { 0 };
        out.push(flags);
        if let Some(n) = node {
            out.extend_from_slice(&n.version.to_le_bytes());
            out.extend_from_slice(&n.owner.to_le_bytes());
            out.extend_from_slice(&n.ctime.to_le_bytes());
            out.extend_from_slice(&n.mtime.to_le_bytes());
            out.extend_from_slice(&n.seq.to_le_bytes());
            match &n.data {
                Some(d) => {
                    out.push(1);
                    out.extend_from_slice(&(d.len() as u32).to_le_bytes());
                    out.extend_from_slice(d);
                }
                None => out.push(0),
            }
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| format!("change-log entry truncated at byte {}", self.at))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Decodes a commit's changes; the error names what is wrong.
pub fn decode(buf: &[u8]) -> Result<Vec<Entry>, String> {
    let mut r = Reader { buf, at: 0 };
    let format = r.u8()?;
    if format != FORMAT {
        return Err(format!("change-log entry of unknown format {format}"));
    }
    let mut out = Vec::new();
    while r.at < buf.len() {
        let len = r.u32()? as usize;
        let path = std::str::from_utf8(r.take(len)?)
            .map_err(|e| format!("change-log path is not UTF-8: {e}"))?
            .to_string();
        let flags = r.u8()?;
        let node = if flags & PRESENT != 0 {
            let version = i32::from_le_bytes(r.array()?);
            let owner = r.u64()?;
            let ctime = r.u64()?;
            let mtime = r.u64()?;
            let seq = i64::from_le_bytes(r.array()?);
            let data = match r.u8()? {
                0 => None,
                _ => {
                    let n = r.u32()? as usize;
                    Some(r.take(n)?.to_vec())
                }
            };
            Some(MemNode {
                data,
                version,
                owner,
                ctime,
                mtime,
                seq,
            })
        } else {
            None
        };
        out.push(Entry {
            path,
            node,
            existed: flags & EXISTED != 0,
        });
    }
    Ok(out)
}

/// Many commits' changes folded into the last image of each node, for one bulk write.
#[derive(Default)]
pub struct Coalesced {
    /// Path → (existed before the first commit folded in, last image).
    nodes: HashMap<String, (bool, Option<MemNode>)>,
}

/// One row of the `nodes` table to write: the node's last image, or `None` to delete it.
pub type Row = (String, Option<MemNode>);

impl Coalesced {
    /// Folds in one commit's changes (commits in order).
    pub fn add(&mut self, entries: Vec<Entry>) {
        for e in entries {
            match self.nodes.get_mut(&e.path) {
                Some(slot) => slot.1 = e.node,
                None => {
                    self.nodes.insert(e.path, (e.existed, e.node));
                }
            }
        }
    }

    /// The row writes that bring the table from before the first commit to after the last,
    /// handed over: the map is left empty, its memory kept for the next round. A node that
    /// did not exist before and is gone after needs none, unless `ahead` (an earlier fold
    /// may have written its row).
    pub fn take_rows(&mut self, ahead: bool) -> Vec<Row> {
        self.nodes
            .drain()
            .filter_map(|(p, (existed, node))| match node {
                Some(n) => Some((p, Some(n))),
                None if existed || ahead => Some((p, None)),
                None => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: i32, data: Option<&[u8]>) -> MemNode {
        MemNode {
            data: data.map(<[u8]>::to_vec),
            version: v,
            owner: 7,
            ctime: 1,
            mtime: 2,
            seq: 3,
        }
    }

    #[test]
    fn round_trip() {
        let a = node(4, Some(b"{\"x\":1}"));
        let b = node(0, None);
        let empty = node(1, Some(b""));
        let buf = encode([
            ("/a", Some(&a), true),
            ("/b", Some(&b), false),
            ("/c", None, true),
            ("/e", Some(&empty), false),
        ]);
        let got = decode(&buf).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].node.as_ref(), Some(&a));
        assert!(got[0].existed);
        assert_eq!(got[1].node.as_ref(), Some(&b));
        assert!(!got[1].existed);
        assert_eq!(got[2].node, None);
        assert!(got[2].existed);
        assert_eq!(got[3].node.as_ref(), Some(&empty));
        assert_eq!(got[3].path, "/e");
    }

    #[test]
    fn corrupt_entries_are_named() {
        let buf = encode([("/a", Some(&node(1, Some(b"abc"))), true)]);
        assert_eq!(decode(&buf[..1]).unwrap(), vec![]);
        for cut in 2..buf.len() {
            let err = decode(&buf[..cut]).unwrap_err();
            assert!(err.contains("truncated"), "{err}");
        }
        assert!(decode(&[9]).unwrap_err().contains("unknown format 9"));
        assert!(decode(&[]).unwrap_err().contains("truncated"));
    }

    #[test]
    fn coalescing_keeps_the_last_image_and_skips_transient_nodes() {
        let mut c = Coalesced::default();
        c.add(vec![
            Entry {
                path: "/lock".into(),
                node: Some(node(0, None)),
                existed: false,
            },
            Entry {
                path: "/status".into(),
                node: Some(node(1, Some(b"1"))),
                existed: true,
            },
            Entry {
                path: "/old".into(),
                node: None,
                existed: true,
            },
        ]);
        c.add(vec![
            Entry {
                path: "/lock".into(),
                node: None,
                existed: true,
            },
            Entry {
                path: "/status".into(),
                node: Some(node(2, Some(b"2"))),
                existed: true,
            },
        ]);
        let mut ups = Vec::new();
        let mut dels = Vec::new();
        for (p, n) in c.take_rows(false) {
            match n {
                Some(n) => ups.push((p, n.version)),
                None => dels.push(p),
            }
        }
        assert_eq!(ups, vec![("/status".to_string(), 2)]);
        assert_eq!(dels, vec!["/old".to_string()]);
    }
}
