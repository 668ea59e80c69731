//! Group commit of adds where every `multi` is a round trip (ZooKeeper): adds that arrive
//! while one `multi` is in flight wait and go together in the next one, so a process under
//! load makes one request for many adds, and a lone add still goes at once.
//!
//! A merged `multi` is all or nothing. When one member's operation fails, that member gets
//! the error (rebased to its own operations) and the others, which were not applied, go
//! again in the next round; an error of the whole request goes to every member.

use lading_core::{Op, OpResult, Tree, TreeError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Most operations in one merged `multi`.
const MAX_OPS: usize = 256;
/// Most bytes of node data in one merged `multi` (ZooKeeper refuses a request over 1 MiB).
const MAX_BYTES: usize = 256 * 1024;

type Reply = oneshot::Sender<Result<Vec<OpResult>, TreeError>>;

#[derive(Default)]
pub(crate) struct Group {
    state: Mutex<GroupState>,
    /// Multis sent for more than one caller.
    merged: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct GroupState {
    /// A drain task is running (it ends when it finds the queue empty).
    running: bool,
    queue: VecDeque<(Vec<Op>, Reply)>,
}

fn data_len(op: &Op) -> usize {
    match op {
        Op::Create { data, .. } | Op::Set { data, .. } => data.as_ref().map_or(0, Vec::len),
        _ => 0,
    }
}

impl Group {
    /// `tree.multi(ops)`, merged with the others waiting. The work runs in a task of its
    /// own, so a caller that stops waiting does not stall the rest.
    pub(crate) async fn multi(
        self: &Arc<Self>,
        tree: &Arc<dyn Tree>,
        ops: Vec<Op>,
    ) -> Result<Vec<OpResult>, TreeError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            s.queue.push_back((ops, tx));
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            tokio::spawn(drain(self.clone(), tree.clone()));
        }
        rx.await
            .unwrap_or_else(|_| Err(TreeError::Backend("a grouped multi was dropped".into())))
    }
}

async fn drain(group: Arc<Group>, tree: Arc<dyn Tree>) {
    loop {
        let mut batch = Vec::new();
        {
            let mut s = group
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (mut ops, mut bytes) = (0, 0);
            while let Some((next, _)) = s.queue.front() {
                let (n, b) = (next.len(), next.iter().map(data_len).sum::<usize>());
                if !batch.is_empty() && (ops + n > MAX_OPS || bytes + b > MAX_BYTES) {
                    break;
                }
                ops += n;
                bytes += b;
                batch.extend(s.queue.pop_front());
            }
            if batch.is_empty() {
                s.running = false;
                return;
            }
        }
        if batch.len() == 1
            && let Some((ops, reply)) = batch.pop()
        {
            let _ = reply.send(tree.multi(ops).await);
            continue;
        }
        let all: Vec<Op> = batch
            .iter()
            .flat_map(|(ops, _)| ops.iter().cloned())
            .collect();
        group
            .merged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match tree.multi(all).await {
            Ok(mut results) => {
                for (ops, reply) in batch.into_iter().rev() {
                    let mine = results.split_off(results.len() - ops.len());
                    let _ = reply.send(Ok(mine));
                }
            }
            Err(TreeError::Multi {
                index,
                op_path,
                cause,
            }) => {
                // The failing member gets its error; the rest go again, first in line.
                let mut offset = 0;
                let mut again = Vec::new();
                let total: usize = batch.iter().map(|(ops, _)| ops.len()).sum();
                for (ops, reply) in batch {
                    let n = ops.len();
                    // (An index past the end names nobody: everyone gets the error.)
                    if (offset..offset + n).contains(&index) || index >= total {
                        let _ = reply.send(Err(TreeError::Multi {
                            index: index - offset,
                            op_path: op_path.clone(),
                            cause: cause.clone(),
                        }));
                    } else {
                        again.push((ops, reply));
                    }
                    offset += n;
                }
                let mut s = group
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for item in again.into_iter().rev() {
                    s.queue.push_front(item);
                }
            }
            Err(e) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lading_store_sqlite::{SqliteOptions, SqliteTree};

    #[tokio::test]
    async fn merged_multis_answer_each_caller_and_a_failure_stays_with_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let tree: Arc<dyn Tree> =
            Arc::new(SqliteTree::open(dir.path().join("t.db"), SqliteOptions::default()).unwrap());
        tree.multi(vec![Op::create("/g", None), Op::create("/g/taken", None)])
            .await
            .unwrap();
        let group = Arc::new(Group::default());
        let mut calls = Vec::new();
        for i in 0..30 {
            let ops = vec![
                Op::create(format!("/g/i{i}"), Some(vec![i as u8])),
                Op::create(format!("/g/i{i}/x"), None),
            ];
            calls.push(group.multi(&tree, ops));
        }
        // Its second op fails: its first must not be applied, and the others must be.
        let bad = vec![Op::create("/g/new", None), Op::create("/g/taken", None)];
        calls.insert(7, group.multi(&tree, bad));
        let results = futures_join_all(calls).await;
        assert!(group.merged.load(std::sync::atomic::Ordering::Relaxed) > 0);
        for (k, r) in results.into_iter().enumerate() {
            if k == 7 {
                let e = r.unwrap_err();
                assert_eq!(e.failed_op(), Some(1), "rebased to its own ops: {e}");
                assert!(matches!(e.root(), TreeError::NodeExists(p) if p == "/g/taken"));
            } else {
                assert_eq!(r.unwrap().len(), 2);
            }
        }
        assert!(tree.get("/g/new").await.unwrap().is_none());
        for i in 0..30 {
            let n = tree.get(&format!("/g/i{i}")).await.unwrap().unwrap();
            assert_eq!(n.data.as_deref(), Some(&[i as u8][..]));
            assert!(tree.get(&format!("/g/i{i}/x")).await.unwrap().is_some());
        }
    }

    /// Polls every future until all are done (a tiny `join_all`).
    async fn futures_join_all<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
        let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
        let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
        std::future::poll_fn(|cx| {
            let mut all = true;
            for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
                if o.is_none() {
                    match f.as_mut().poll(cx) {
                        std::task::Poll::Ready(v) => *o = Some(v),
                        std::task::Poll::Pending => all = false,
                    }
                }
            }
            if all {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        out.into_iter().map(Option::unwrap).collect()
    }
}
