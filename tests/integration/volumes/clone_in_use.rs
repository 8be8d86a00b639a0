//! Clones of volumes in use, on real loop drives, by the real agent.
//!
//! - an ext4 and an xfs volume staged read-write, a thread appending numbered lines to a
//!   file on it without pause, are cloned while it writes (the default class): the clone
//!   is made under a freeze of the source, its PV attribute says `frozen`, and staged it
//!   holds a prefix of what the writer wrote, whole lines only; unstaged, its filesystem
//!   checks clean (`e2fsck -fn`, `xfs_repair -n`); the writer's longest pause is
//!   measured and printed beside the freeze drivelet recorded;
//! - a class saying `drivelet.io/clone-in-use: refuse`, or a freeze limit the copy
//!   cannot meet (`drivelet.io/clone-freeze-limit: 1ms`: refused before any freeze,
//!   saying how long it would take), or a block volume in use under the default class:
//!   FAILED_PRECONDITION in words, nothing changed on the drive;
//! - a block volume in use under a class saying `drivelet.io/clone-in-use-block:
//!   crash-inconsistent` is cloned, its PV attribute says so.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::clone::{devnode_of, Bed};
use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

/// A thread appending `0\n`, `1\n`, ... to a file, one write each, as fast as it can.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, Duration)>,
}

impl Writer {
    fn start(path: std::path::PathBuf) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
            let (mut n, mut longest, mut last) = (0u64, Duration::ZERO, Instant::now());
            while !s.load(Ordering::Relaxed) {
                f.write_all(format!("{n}\n").as_bytes()).unwrap();
                n += 1;
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
            (n, longest)
        });
        Writer { stop, thread }
    }

    /// Stops it: (lines written, its longest pause between two writes).
    fn stop(self) -> (u64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn with_params(mut q: csi::CreateVolumeRequest, params: &[(&str, &str)]) -> csi::CreateVolumeRequest {
    q.parameters = kv(params);
    q
}

fn consistency(v: &csi::Volume) -> Option<&str> {
    v.volume_context.get("drivelet.io/clone-consistency").map(String::as_str)
}

fn clone_while_written(fs: &str, size: u64) {
    let bed = Bed::new(2 * GIB);
    let src = bed.create(create_req(&format!("pvc-live-{fs}"), size, mount_cap(fs))).expect("the source").volume_id;
    let st = bed.stage(&src, "stage-src", mount_cap(fs));
    let writer = Writer::start(st.join("seq"));
    // Written for a while first, so the copy has something to hold.
    std::thread::sleep(Duration::from_millis(300));
    let began = Instant::now();
    let copy = bed.create(clone_req(&format!("pvc-live-copy-{fs}"), size, 0, mount_cap(fs), &src)).expect("a clone of a volume in use");
    let took = began.elapsed();
    std::thread::sleep(Duration::from_millis(100));
    let (lines, longest) = writer.stop();
    assert_eq!(consistency(&copy), Some("frozen"), "{fs}: the clone's attributes {:?}", copy.volume_context);
    let vols = bed.agent.ctl_volumes();
    let rec = vols.as_array().unwrap().iter().find(|v| v["id"] == copy.volume_id.as_str()).expect("the clone listed").clone();
    let frozen = rec["copied_in_use"]["frozen"]["millis"].as_u64().unwrap_or_else(|| panic!("{fs}: the clone's record {rec}"));
    println!("{fs}: cloned in {took:?} while {lines} lines were written; the writer's longest pause {longest:?}, the freeze drivelet recorded {frozen} ms");
    assert!(longest >= Duration::from_millis(frozen.saturating_sub(5)), "{fs}: the writer paused for the freeze ({longest:?} < {frozen} ms)");

    // The clone holds a prefix of what was written, whole lines, in order.
    let source_bytes = std::fs::read(st.join("seq")).unwrap();
    let cst = bed.stage(&copy.volume_id, "stage-copy", mount_cap(fs));
    let cloned = std::fs::read(cst.join("seq")).unwrap();
    assert!(!cloned.is_empty() && cloned.len() < source_bytes.len(), "{fs}: the clone holds {} of {} bytes", cloned.len(), source_bytes.len());
    assert_eq!(&source_bytes[..cloned.len()], &cloned[..], "{fs}: the clone is a prefix of the source");
    assert_eq!(cloned.last(), Some(&b'\n'), "{fs}: whole lines only");
    let count = cloned.iter().filter(|&&b| b == b'\n').count();
    println!("{fs}: the clone holds the first {count} of {lines} lines");
    bed.unstage(&copy.volume_id, &cst);
    bed.unstage(&src, &st);

    // Its filesystem checks clean on its own.
    let dev = devnode_of(&bed.agent, &bed.drive, &copy.volume_id);
    let check = match fs {
        "ext4" => std::process::Command::new("e2fsck").args(["-fn"]).arg(&dev).output().unwrap(),
        _ => std::process::Command::new("xfs_repair").args(["-n"]).arg(&dev).output().unwrap(),
    };
    assert!(check.status.success(), "{fs}: the clone does not check clean: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    bed.delete(&copy.volume_id);
    bed.delete(&src);
}

#[test]
fn an_ext4_volume_being_written_is_cloned_under_a_freeze_holding_a_prefix_of_its_writes() {
    clone_while_written("ext4", 256 * MIB);
}

#[test]
fn an_xfs_volume_being_written_is_cloned_under_a_freeze_holding_a_prefix_of_its_writes() {
    clone_while_written("xfs", 320 * MIB);
}

#[test]
fn a_volume_in_use_is_refused_in_words_when_its_class_or_the_freeze_limit_says_so_and_a_block_one_unless_it_accepts_an_inconsistent_copy() {
    let bed = Bed::new(2 * GIB);
    let parts = || kernel_parts(&bed.drive.dev);
    let src = bed.create(create_req("pvc-busy", 64 * MIB, mount_cap("ext4"))).expect("the source").volume_id;
    let st = bed.stage(&src, "stage-busy", mount_cap("ext4"));
    std::fs::write(st.join("data"), vec![7u8; 8 << 20]).unwrap();
    let before = parts();
    let refused = |what: &str, q: csi::CreateVolumeRequest, words: &[&str]| {
        let e = bed.create(q).expect_err(what);
        assert_eq!(e.code(), Code::FailedPrecondition, "{what}: {}", e.message());
        for w in words {
            assert!(e.message().contains(w), "{what}: {:?} lacks {w:?}", e.message());
        }
        assert_eq!(parts(), before, "{what}: nothing changed on the drive");
    };
    refused(
        "a class that refuses",
        with_params(clone_req("pvc-busy-1", 64 * MIB, 0, mount_cap("ext4"), &src), &[("drivelet.io/clone-in-use", "refuse")]),
        &["mounted read-write at", "drivelet.io/clone-in-use: refuse", "once no pod writes to it"],
    );
    refused(
        "a freeze limit the copy cannot meet",
        with_params(clone_req("pvc-busy-2", 64 * MIB, 0, mount_cap("ext4"), &src), &[("drivelet.io/clone-freeze-limit", "1ms")]),
        &["would freeze its writers for about", "longer than the 1 ms allowed", "drivelet.io/clone-freeze-limit"],
    );
    bed.unstage(&src, &st);

    // A block volume a pod writes to: nothing to freeze.
    let blk = bed.create(create_req("pvc-busy-blk", 32 * MIB, block_cap())).expect("a block source").volume_id;
    let bst = bed.stage(&blk, "stage-blk", block_cap());
    let before_blk = parts();
    let e = bed.create(clone_req("pvc-busy-3", 32 * MIB, 0, block_cap(), &blk)).expect_err("a block volume in use");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    for w in ["cannot clone block volume", "no filesystem drivelet could freeze", "drivelet.io/clone-in-use-block: crash-inconsistent"] {
        assert!(e.message().contains(w), "{:?} lacks {w:?}", e.message());
    }
    assert_eq!(parts(), before_blk, "a refused block clone changed nothing");
    let copy = bed
        .create(with_params(clone_req("pvc-busy-3", 32 * MIB, 0, block_cap(), &blk), &[("drivelet.io/clone-in-use-block", "crash-inconsistent")]))
        .expect("a block clone its class accepts inconsistent");
    assert_eq!(consistency(&copy), Some("crash-inconsistent"), "{:?}", copy.volume_context);
    bed.unstage(&blk, &bst);
    for id in [&copy.volume_id, &blk, &src] {
        bed.delete(id);
    }
}
