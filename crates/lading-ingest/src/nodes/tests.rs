//! Unit tests of storage nodes (some against a real SeaweedFS).

use super::*;
use lading_testkit::seaweed::{ACCESS_KEY, SECRET_KEY, Weed};

/// The completion of a multipart upload is conditional: a key another writer made while
/// the parts went up is kept, and the completion is refused as `AlreadyExists`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_completion_never_replaces_a_key_made_meanwhile() {
    let weed = Weed::start().unwrap();
    weed.bucket("primary").unwrap();
    // Each checksum a node may ask the server for.
    for checksum in ["sha256", "crc64nvme"] {
        completion_is_conditional(&weed, checksum).await;
    }
}

async fn completion_is_conditional(weed: &Weed, checksum: &str) {
    let node = Node::open(
        &NodeSettings {
            id: 9501,
            url: "s3://primary/lading".into(),
            endpoint: Some(weed.endpoint()),
            region: None,
            access_key_id_env: None,
            secret_access_key_env: None,
            part_size: None,
            checksum: Some(checksum.into()),
        },
        |k| match k {
            "AWS_ACCESS_KEY_ID" => Some(ACCESS_KEY.into()),
            "AWS_SECRET_ACCESS_KEY" => Some(SECRET_KEY.into()),
            _ => None,
        },
    )
    .unwrap();
    let Place::Bucket { store, .. } = &node.place else {
        panic!("a bucket node")
    };
    let part = vec![7u8; MIN_PART_SIZE as usize];
    let upload = async |rel: &str| {
        let key = node
            .key(&format!("ark:/99999/fk4{checksum}"), 1, rel)
            .unwrap();
        let id = store.create_multipart(&key).await.unwrap();
        let p = store
            .put_part(&key, &id, 0, PutPayload::from(part.clone()))
            .await
            .unwrap();
        (key, id, p)
    };
    // Alone: completed.
    let (key, id, p) = upload("producer/alone|1 &.bin").await;
    store.complete(&key, &id, vec![p], true).await.unwrap();
    let got = store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(got.len(), part.len());
    // Another writer made the key while the parts went up: refused, theirs kept.
    let (key, id, p) = upload("producer/raced.bin").await;
    store
        .put(&key, PutPayload::from_static(b"theirs"))
        .await
        .unwrap();
    let e = store.complete(&key, &id, vec![p], true).await.unwrap_err();
    assert!(
        matches!(e, object_store::Error::AlreadyExists { .. }),
        "{e}"
    );
    let got = store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"theirs");
    store.abort_multipart(&key, &id).await.unwrap();
    assert_eq!(weed.open_uploads("primary"), 0);
}
