//! Unit tests of the fetcher.

use super::*;

/// A server in memory that answers every request with `answer`, then hangs up.
struct Canned(&'static [u8]);

impl Source for Canned {
    fn connect<'a>(
        &'a self,
        _url: &'a str,
    ) -> lading_core::BoxFuture<'a, std::io::Result<tokio::io::DuplexStream>> {
        let answer = self.0;
        Box::pin(async move {
            let (client, mut server) = tokio::io::duplex(4096);
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 4096];
                let _ = server.read(&mut buf).await;
                let _ = server.write_all(answer).await;
            });
            Ok(client)
        })
    }
}

/// Over a source's wire, a body cut short of its stated length is an error to retry, a
/// 5xx is one too, a 404 is fatal, and a whole body is read.
#[tokio::test]
async fn a_sources_answers_are_read_as_from_the_network() {
    let get = |answer: &'static [u8]| async move {
        Fetcher::new()
            .with_source(Arc::new(Canned(answer)))
            .get_text("http://payloads.invalid/m.checkm", &Trust::Operator)
            .await
    };
    let cut = get(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789").await;
    assert!(
        matches!(&cut, Err(FetchError::Transient(m)) if m.starts_with("cannot fetch http://payloads.invalid/m.checkm")),
        "{cut:?}"
    );
    let busy = get(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n").await;
    assert!(
        matches!(&busy, Err(FetchError::Transient(m)) if m.ends_with("answered 503 Service Unavailable")),
        "{busy:?}"
    );
    let gone = get(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
    assert!(matches!(&gone, Err(FetchError::Fatal(_))), "{gone:?}");
    let whole = get(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").await;
    assert_eq!(whole.unwrap(), "hello");
}

/// A sink whose file is `/dev/full`: every write fails with "no space left".
fn full_sink() -> Sink {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    Sink::new(file, None, PathBuf::from("/dev/full"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_download_with_the_reason() {
    // Small: the error comes at the end.
    let mut sink = full_sink();
    sink.push(Bytes::from_static(b"a few bytes")).await.unwrap();
    let Err(FetchError::Transient(e)) = sink.finish().await else {
        panic!("a failed write must fail the download");
    };
    assert!(e.contains("\"full\"") && e.contains("No space left"), "{e}");
    // Large: it stops the download while bytes still arrive (the queue stays bounded).
    let mut sink = full_sink();
    let block = Bytes::from(vec![7u8; WRITE_BLOCK]);
    let mut failed = None;
    for _ in 0..4 * BLOCKS_IN_FLIGHT {
        if let Err(e) = sink.push(block.clone()).await {
            failed = Some(e);
            break;
        }
    }
    let Some(FetchError::Transient(e)) = failed else {
        panic!("pushing must fail once the writer stopped: {failed:?}");
    };
    assert!(e.contains("No space left"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_writes_and_hashes_every_byte_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let mut sink = Sink::new(
        std::fs::File::create(&path).unwrap(),
        Some(Hasher::new(HashAlg::Md5)),
        path.clone(),
    );
    let mut all = Vec::new();
    // Uneven pieces, so blocks and pieces do not line up.
    for i in 0..5000u32 {
        let piece: Vec<u8> = (0..(i % 997) as usize + 1)
            .map(|j| (i as usize * 31 + j) as u8)
            .collect();
        all.extend_from_slice(&piece);
        // Empty chunks too: they must not upset the writer.
        if i % 1000 == 0 {
            sink.push(Bytes::new()).await.unwrap();
        }
        sink.push(Bytes::from(piece)).await.unwrap();
    }
    let (n, sha, md5) = sink.finish().await.unwrap();
    assert_eq!(n, all.len() as u64);
    assert!(all.len() > 2 * WRITE_BLOCK);
    assert_eq!(std::fs::read(&path).unwrap(), all);
    let mut h = Hasher::new(HashAlg::Sha256);
    h.update(&all);
    assert_eq!(sha, h.hex());
    let mut h = Hasher::new(HashAlg::Md5);
    h.update(&all);
    assert_eq!(md5, Some(h.hex()));
}
