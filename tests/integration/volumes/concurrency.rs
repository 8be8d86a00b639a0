//! Concurrent CSI calls against one agent, each on its own connection from a
//! multi-threaded client.
//!
//! Rules checked (the volume manager's: one operation per volume at a time, a second
//! one gets ABORTED; different volumes proceed in parallel; placement reserves space
//! before any disk is touched):
//! - parallel creates with one name make one volume: every call gets it or ABORTED;
//! - parallel creates with distinct names all succeed (retried on ABORTED or
//!   UNAVAILABLE), their partitions never overlap, and the on-disk GPTs list exactly
//!   them; parallel deletes give every partition back;
//! - stages of different volumes run in parallel, and a second stage of a volume that
//!   is being staged gets ABORTED or OK, nothing else, and mounts it once.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tokio::sync::Barrier;
use tonic::{Code, Status};

/// No single CSI call may take longer than this.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

fn multi_thread_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
}

/// Runs `n` calls at once: each task connects, waits until all are connected, then
/// makes its call. Results come back in task order.
async fn all_at_once<T, F, Fut>(sock: &Path, n: usize, call: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, Csi) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let c = Csi::connect_path(sock).await;
        let fut = call(i, c);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            tokio::time::timeout(CALL_TIMEOUT, fut).await.unwrap_or_else(|_| panic!("call {i} hung for {CALL_TIMEOUT:?}"))
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task panicked"));
    }
    out
}

fn describe<T: std::fmt::Debug>(results: &[Result<T, Status>]) -> String {
    results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().err().map(|e| format!("call {i}: {:?} {}", e.code(), e.message())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A kernel partition: name, start and size in bytes.
type Part = (String, u64, u64);

/// The pairs of partitions that overlap.
fn overlaps(parts: &[Part]) -> Vec<(Part, Part)> {
    let mut bad = Vec::new();
    for (i, a) in parts.iter().enumerate() {
        for b in &parts[i + 1..] {
            if a.1 < b.1 + b.2 && b.1 < a.1 + a.2 {
                bad.push((a.clone(), b.clone()));
            }
        }
    }
    bad
}

#[test]
fn parallel_creates_with_one_name_make_one_volume_and_every_call_gets_it_or_aborted() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let sock = agent.csi_socket.clone();
    let rt = multi_thread_rt();

    let results = rt.block_on(all_at_once(&sock, 50, |_, mut c| async move {
        c.ctrl.create_volume(create_req("pvc-same", 64 * MIB, mount_cap("ext4"))).await.map(|r| r.into_inner().volume.unwrap())
    }));
    let bad: Vec<_> = results.iter().filter(|r| r.as_ref().is_err_and(|e| e.code() != Code::Aborted)).collect();
    assert!(bad.is_empty(), "every call is OK or ABORTED:\n{}\nlog:\n{}", describe(&results), agent.log_tail(60));
    let ids: BTreeSet<String> = results.iter().filter_map(|r| r.as_ref().ok()).map(|v| v.volume_id.clone()).collect();
    assert_eq!(ids.len(), 1, "all OKs carry one volume id (and at least one is OK): {ids:?}\n{}", describe(&results));
    let id = ids.into_iter().next().unwrap();
    let parts = kernel_parts(&a.dev);
    assert_eq!(parts.len(), 1, "exactly one kernel partition: {parts:?}");
    assert_eq!(gpt_entries(&a.dev).len(), 1, "exactly one GPT entry: {:?}", gpt_entries(&a.dev));

    rt.block_on(async {
        let mut c = Csi::connect_path(&sock).await;
        let again = c.ctrl.create_volume(create_req("pvc-same", 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap();
        assert_eq!(again.volume_id, id, "a later create with the name returns the same volume");
        c.ctrl.delete_volume(del_req(&id)).await.unwrap();
    });
    assert!(kernel_parts(&a.dev).is_empty(), "the delete removed the partition: {:?}", kernel_parts(&a.dev));
}

#[test]
fn parallel_creates_with_distinct_names_fill_two_drives_without_overlap_and_parallel_deletes_empty_them() {
    require_host();
    const N: usize = 20;
    // 20 x 96 MiB does not fit on one 1 GiB drive: both drives take volumes.
    const SIZE: u64 = 96 * MIB;
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let b = LoopDrive::new(tmp.path(), "b.img", GIB);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let sock = agent.csi_socket.clone();
    let rt = multi_thread_rt();

    let results = rt.block_on(all_at_once(&sock, N, |i, mut c| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match c.ctrl.create_volume(create_req(&format!("pvc-{i}"), SIZE, mount_cap("ext4"))).await {
                Ok(r) => return Ok(r.into_inner().volume.unwrap()),
                Err(e) if matches!(e.code(), Code::Aborted | Code::Unavailable) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => return Err(e),
            }
        }
    }));
    assert!(results.iter().all(Result::is_ok), "every create succeeds:\n{}\nlog:\n{}", describe(&results), agent.log_tail(60));
    let ids: BTreeSet<String> = results.iter().map(|r| r.as_ref().unwrap().volume_id.clone()).collect();
    assert_eq!(ids.len(), N, "{N} distinct volumes");

    let mut guids = BTreeSet::new();
    let mut total = 0;
    for d in [&a, &b] {
        let parts = kernel_parts(&d.dev);
        assert!(!parts.is_empty(), "{} holds volumes too (one drive cannot hold them all)", d.dev.display());
        assert!(overlaps(&parts).is_empty(), "overlapping partitions on {}: {:?}", d.dev.display(), overlaps(&parts));
        assert!(parts.iter().all(|p| p.2 == SIZE), "every partition has the asked size: {parts:?}");
        let gpt = gpt_entries(&d.dev);
        let on_disk: BTreeSet<(u64, u64)> = gpt.iter().map(|e| (e.start, e.size)).collect();
        let in_kernel: BTreeSet<(u64, u64)> = parts.iter().map(|p| (p.1, p.2)).collect();
        assert_eq!(on_disk, in_kernel, "the GPT of {} and the kernel agree: {gpt:?}", d.dev.display());
        total += gpt.len();
        guids.extend(gpt.iter().map(|e| e.uuid.to_lowercase()));
    }
    assert_eq!(total, N, "the GPTs list exactly {N} partitions");
    assert_eq!(guids.len(), N, "the partition GUIDs are distinct");
    assert_eq!(guids, ids, "the partition GUIDs are the volume ids");

    let ids: Vec<String> = ids.into_iter().collect();
    let deletes = rt.block_on(all_at_once(&sock, N, |i, mut c| {
        let id = ids[i].clone();
        async move { c.ctrl.delete_volume(del_req(&id)).await.map(|r| r.into_inner()) }
    }));
    assert!(deletes.iter().all(Result::is_ok), "every delete succeeds:\n{}\nlog:\n{}", describe(&deletes), agent.log_tail(60));
    for d in [&a, &b] {
        assert!(kernel_parts(&d.dev).is_empty(), "no kernel partition left on {}: {:?}", d.dev.display(), kernel_parts(&d.dev));
        assert!(gpt_entries(&d.dev).is_empty(), "no GPT entry left on {}: {:?}", d.dev.display(), gpt_entries(&d.dev));
    }
}

#[test]
fn stages_of_two_volumes_run_in_parallel_and_a_second_stage_in_flight_is_aborted_or_ok() {
    require_host();
    const SECOND_STAGES: usize = 4;
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", GIB);
    sh("udevadm", &["settle"]);
    let _u = Unmounter(tmp.path().to_path_buf());
    let kubelet = tmp.path().join("kubelet");
    let stage_a = kubelet.join("plugins/stage-a");
    let stage_b = kubelet.join("plugins/stage-b");
    std::fs::create_dir_all(&stage_a).unwrap();
    std::fs::create_dir_all(&stage_b).unwrap();
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let sock = agent.csi_socket.clone();
    let rt = multi_thread_rt();

    let (va, vb) = rt.block_on(async {
        let mut c = Csi::connect_path(&sock).await;
        let va = c.ctrl.create_volume(create_req("pvc-a", 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap();
        let vb = c.ctrl.create_volume(create_req("pvc-b", 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap();
        (va.volume_id, vb.volume_id)
    });

    // Call 0 stages B; calls 1.. stage A, all at once.
    let jobs: Vec<(String, PathBuf, csi::VolumeCapability)> = std::iter::once((vb.clone(), stage_b.clone(), mount_cap("ext4")))
        .chain((0..=SECOND_STAGES).map(|_| (va.clone(), stage_a.clone(), mount_cap("ext4"))))
        .collect();
    let results = rt.block_on(all_at_once(&sock, jobs.len(), |i, mut c| {
        let (id, path, cap) = jobs[i].clone();
        async move { c.node.node_stage_volume(stage_req(&id, &path, cap)).await.map(|r| r.into_inner()) }
    }));
    assert!(results[0].is_ok(), "the stage of B succeeds alongside A's:\n{}\nlog:\n{}", describe(&results), agent.log_tail(60));
    let a_results = &results[1..];
    assert!(
        a_results.iter().all(|r| r.as_ref().is_ok() || r.as_ref().is_err_and(|e| e.code() == Code::Aborted)),
        "every stage of A is OK or ABORTED:\n{}\nlog:\n{}",
        describe(&results),
        agent.log_tail(60)
    );
    assert!(a_results.iter().any(Result::is_ok), "one stage of A succeeds:\n{}", describe(&results));
    assert_eq!(mounts_under(&stage_a).len(), 1, "A is mounted once: {:?}", mounts_under(&stage_a));
    assert_eq!(mounts_under(&stage_b).len(), 1, "B is mounted once: {:?}", mounts_under(&stage_b));
    assert_eq!(sh("findmnt", &["-n", "-o", "FSTYPE", stage_a.to_str().unwrap()]), "ext4");
    assert_eq!(sh("findmnt", &["-n", "-o", "FSTYPE", stage_b.to_str().unwrap()]), "ext4");

    rt.block_on(async {
        let mut c = Csi::connect_path(&sock).await;
        // Once nothing is in flight, staging A again is a plain idempotent OK.
        c.node.node_stage_volume(stage_req(&va, &stage_a, mount_cap("ext4"))).await.unwrap();
        for (id, path) in [(&va, &stage_a), (&vb, &stage_b)] {
            let req = csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: path.display().to_string() };
            c.node.node_unstage_volume(req).await.unwrap();
            c.ctrl.delete_volume(del_req(id)).await.unwrap();
        }
    });
    assert!(mounts_under(tmp.path()).is_empty(), "no mounts remain: {:?}", mounts_under(tmp.path()));
    assert!(kernel_parts(&drive.dev).is_empty(), "no partitions remain: {:?}", kernel_parts(&drive.dev));
}
