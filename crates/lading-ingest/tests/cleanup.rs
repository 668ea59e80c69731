//! Cleanup and sweeps: old batches and their working folders go but stored objects stay, a
//! batch that cannot be removed is passed and keeps its folders, an uploaded payload goes with
//! its batch, and a worker starting removes what failed stores left in the storage root.

#[macro_use]
mod common;

use common::*;
use lading_core::BatchState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_old_batches_and_working_folders_but_not_stored_objects() {
    let w = World::new().await;
    let (ingest, bid) = w.submit_object(&[("f.txt", b"keep me")]).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&bid, &[BatchState::Completed]).await;
    run.stop().await;
    let job = w.jobs_of(&bid).await.remove(0);
    let stored_at = w.stored(&job).await.path;
    assert!(w.cfg.work_dir().join(job.as_str()).exists());
    let now = w.engine.clock().now_ms();
    // Younger than the retention: kept.
    let kept = lading_ingest::cleanup::cleanup(&ingest, now, 3_600_000)
        .await
        .unwrap();
    assert_eq!(kept.batches, 0);
    let gone = lading_ingest::cleanup::cleanup(&ingest, now + 3_600_001, 3_600_000)
        .await
        .unwrap();
    assert_eq!((gone.batches, gone.jobs), (1, 1));
    assert!(w.engine.batch(&bid).await.is_err());
    assert!(!w.cfg.work_dir().join(job.as_str()).exists());
    assert!(
        std::path::Path::new(&stored_at)
            .join("producer/f.txt")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_goes_past_a_batch_it_cannot_remove_and_keeps_that_batchs_folders() {
    let w = World::new().await;
    let (ingest, first) = w.submit_object(&[("a.txt", b"first")]).await;
    let (_, second) = w.submit_object(&[("b.txt", b"second")]).await;
    let run = w.run_all(&ingest);
    w.batch_reaches(&first, &[BatchState::Completed]).await;
    w.batch_reaches(&second, &[BatchState::Completed]).await;
    run.stop().await;
    let (j1, j2) = (
        w.jobs_of(&first).await.remove(0),
        w.jobs_of(&second).await.remove(0),
    );
    // Another process holds the first batch (as a reporter would): cleanup leaves it, with
    // its working folder, and removes the second all the same.
    let lock = lading_core::layout::batch_node(&first, "lock");
    w.engine
        .tree()
        .create(&lock, None, lading_core::tree::CreateMode::Persistent)
        .await
        .unwrap();
    let later = w.engine.clock().now_ms() + 3_600_001;
    let c = lading_ingest::cleanup::cleanup(&ingest, later, 3_600_000)
        .await
        .unwrap();
    assert_eq!((c.batches, c.jobs), (1, 1));
    assert_eq!(
        w.engine.batch(&first).await.unwrap().status.status,
        BatchState::Completed
    );
    assert!(w.engine.job(&j1).await.is_ok());
    assert!(w.cfg.work_dir().join(j1.as_str()).exists());
    assert!(w.engine.batch(&second).await.is_err());
    assert!(!w.cfg.work_dir().join(j2.as_str()).exists());
    // Let go: the next pass removes it.
    w.engine.tree().delete(&lock, None).await.unwrap();
    let c = lading_ingest::cleanup::cleanup(&ingest, later, 3_600_000)
        .await
        .unwrap();
    assert_eq!((c.batches, c.jobs), (1, 1));
    assert!(w.engine.batch(&first).await.is_err());
    assert!(!w.cfg.work_dir().join(j1.as_str()).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_an_uploaded_payload_with_its_batch_but_no_other_file() {
    let w = World::new().await;
    // As the server saves uploads: DATA_DIR/uploads/UUID/NAME.
    let up = std::path::absolute(w.cfg.data_dir.join("uploads/abc123")).unwrap();
    std::fs::create_dir_all(&up).unwrap();
    std::fs::write(up.join("u.bin"), b"uploaded").unwrap();
    let elsewhere = w.payload().join("local.bin");
    std::fs::write(&elsewhere, b"a local payload").unwrap();
    let ingest = w.ingest();
    let a = w
        .submit(
            &ingest,
            &format!("file://{}", up.join("u.bin").display()),
            "file",
        )
        .await;
    let b = w
        .submit(&ingest, &format!("file://{}", elsewhere.display()), "file")
        .await;
    let run = w.run_all(&ingest);
    w.completes(&a).await;
    w.completes(&b).await;
    run.stop().await;
    let now = w.engine.clock().now_ms();
    let gone = lading_ingest::cleanup::cleanup(&ingest, now + 3_600_001, 3_600_000)
        .await
        .unwrap();
    assert_eq!(gone.batches, 2);
    assert!(!up.exists(), "the upload went with its batch");
    assert!(elsewhere.exists(), "a payload that was not uploaded stays");
    assert!(w.cfg.data_dir.join("uploads").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_removes_what_failed_stores_left_in_the_storage_root() {
    let w = World::new().await;
    let root = w.cfg.storage_root();
    // A stored object with a partial copy of a job that is gone, and an empty object folder.
    let kept = root.join("ark_99999_fk4kept");
    std::fs::create_dir_all(kept.join("v1/producer")).unwrap();
    std::fs::write(kept.join("v1/producer/a.txt"), b"stored").unwrap();
    std::fs::create_dir_all(kept.join(".tmp-jid0000000042/producer")).unwrap();
    std::fs::write(kept.join(".tmp-jid0000000042/producer/a.txt"), b"half").unwrap();
    std::fs::create_dir_all(root.join("ark_99999_fk4empty")).unwrap();
    let ingest = w.ingest();
    let run = w.run_all(&ingest);
    // The sweep runs before the stages start: a batch completing proves it has run.
    let (url, _) = w.file("x.bin", b"x");
    let bid = w.submit(&ingest, &url, "file").await;
    w.completes(&bid).await;
    run.stop().await;
    assert!(
        !kept.join(".tmp-jid0000000042").exists(),
        "the partial copy went"
    );
    assert!(
        !root.join("ark_99999_fk4empty").exists(),
        "the empty folder went"
    );
    assert_eq!(
        std::fs::read(kept.join("v1/producer/a.txt")).unwrap(),
        b"stored",
        "stored versions stay"
    );
}
