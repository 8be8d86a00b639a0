//! Drive inventory end to end: the real binary, real loop devices, real udev.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;

const GIB: u64 = 1 << 30;

#[test]
fn disks_are_classified_with_reasons_and_foreign_data_is_untouched() {
    require_host();
    let tmp = short_tempdir();
    let blank = LoopDrive::new(tmp.path(), "blank.img", GIB);
    let with_fs = LoopDrive::new(tmp.path(), "with-fs.img", GIB);
    sh("mkfs.ext4", &["-q", "-F", with_fs.dev.to_str().unwrap()]);
    // udev re-probes a device after a writer closes it, but that event may not be
    // queued yet when `settle` runs: ask for the probe and wait for it.
    sh("udevadm", &["trigger", "--action=change", "--settle", with_fs.dev.to_str().unwrap()]);
    let excluded = LoopDrive::new(tmp.path(), "excluded-1.img", GIB);
    sh("udevadm", &["settle"]);
    let before = digest(&with_fs.file);

    let mut agent = Agent::start(
        tmp.path(),
        AgentOpts { filters: format!("exclude_paths = [\"{}/excluded-*\"]", tmp.path().display()), ..Default::default() },
    );
    let drives = agent.ctl_drives();

    let d = drive_by_path(&drives, &blank.dev).expect("blank drive listed");
    assert_eq!(d["class"], "managed", "{d}");
    // A blank drive is taken and zeroed whole before its first volume: blank until the
    // cleaner's first step writes drivelet's (empty) table.
    let reason = d["reason"].as_str().unwrap();
    assert!(reason.contains("blank") || reason == "drivelet GPT with 0 volume partitions", "{d}");
    assert_eq!(d["media"], "virtual");
    assert_eq!(d["transport"], "loop");
    assert_eq!(d["size_bytes"], GIB);
    assert_eq!(d["free_bytes"], 1022 * (1u64 << 20), "1 GiB minus GPT and alignment");
    assert!(d["id"].as_str().unwrap().starts_with("loop-blank.img-"), "{d}");

    let d = drive_by_path(&drives, &with_fs.dev).expect("fs drive listed");
    assert_eq!(d["class"], "foreign", "{d}");
    assert!(d["reason"].as_str().unwrap().contains("ext4"), "{d}");
    assert_eq!(d["free_bytes"], 0);

    let d = drive_by_path(&drives, &excluded.dev).expect("excluded drive listed");
    assert_eq!(d["class"], "excluded", "{d}");
    assert!(d["reason"].as_str().unwrap().contains("drives.filters.exclude_paths"), "{d}");

    let root = root_disk();
    let d = drive_by_path(&drives, &root).unwrap_or_else(|| panic!("root disk {} listed in {drives}", root.display()));
    assert_eq!(d["class"], "system", "{d}");
    assert!(d["reason"].as_str().unwrap().contains("mounted filesystem at /"), "{d}");

    // The human table names every class too.
    let out = std::process::Command::new(bin())
        .args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drives"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("ID"), "{table}");
    for word in ["managed", "foreign", "excluded", "system"] {
        assert!(table.contains(word), "{word} missing in\n{table}");
    }

    assert_eq!(agent.stop(), 0, "clean exit on SIGTERM; log:\n{}", agent.logs());
    assert!(!agent.csi_socket.exists(), "CSI socket removed at stop");
    assert!(!agent.admin_socket.exists(), "admin socket removed at stop");
    assert_eq!(digest(&with_fs.file), before, "the foreign drive is byte-for-byte unchanged");
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not seen within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    t0.elapsed()
}

#[test]
fn drives_appear_and_vanish_live() {
    require_host();
    let tmp = short_tempdir();
    let _first = LoopDrive::new(tmp.path(), "first.img", GIB);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let rt = rt();
    let drives = || -> Vec<drivelet::actors::inventory::model::Drive> {
        rt.block_on(drivelet::cli::ctl::drives(&agent.admin_socket)).expect("admin answers").into_iter().map(|v| v.drive).collect()
    };

    let mut hot = LoopDrive::new(tmp.path(), "hotplug.img", GIB);
    let dev = hot.dev.clone();
    let took = wait_for("attached drive", Duration::from_secs(1), || {
        drives().iter().any(|d| d.path == dev && d.class.as_str() == "managed")
    });
    eprintln!("attach -> listed as managed: {took:?}");

    hot.detach();
    let took = wait_for("detached drive gone", Duration::from_secs(1), || !drives().iter().any(|d| d.path == dev));
    eprintln!("detach -> gone: {took:?}");

    // A filesystem made while running turns the drive foreign, live.
    let fresh = LoopDrive::new(tmp.path(), "fresh.img", GIB);
    let dev = fresh.dev.clone();
    wait_for("fresh drive managed", Duration::from_secs(5), || {
        drives().iter().any(|d| d.path == dev && d.class.as_str() == "managed")
    });
    sh("mkfs.xfs", &["-q", "-f", fresh.dev.to_str().unwrap()]);
    wait_for("drive with new fs turns foreign", Duration::from_secs(5), || {
        drives().iter().any(|d| d.path == dev && d.class.as_str() == "foreign" && d.reason.contains("xfs"))
    });
    let log = agent.logs();
    assert!(log.contains("\"drive.id\""), "structured drive fields in logs:\n{log}");
    assert!(log.contains("drive appeared") && log.contains("drive gone"), "{log}");
}

#[test]
fn loop_devices_are_not_drives_unless_allowed() {
    require_host();
    let tmp = short_tempdir();
    let d = LoopDrive::new(tmp.path(), "disk.img", GIB);
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts { extra_toml: String::new(), filters: String::new() });
    assert!(drive_by_path(&agent.ctl_drives(), &d.dev).is_some());
    drop(agent);

    let tmp2 = short_tempdir();
    let cfg = std::fs::read_to_string(tmp.path().join("drivelet.toml"))
        .unwrap()
        .replace("allow_loop = true", "allow_loop = false")
        .replace(tmp.path().to_str().unwrap(), tmp2.path().to_str().unwrap());
    std::fs::write(tmp2.path().join("drivelet.toml"), cfg).unwrap();
    let mut agent = Agent {
        dir: tmp2.path().to_path_buf(),
        config: tmp2.path().join("drivelet.toml"),
        csi_socket: tmp2.path().join("csi.sock"),
        admin_socket: tmp2.path().join("admin.sock"),
        child: None,
        log: tmp2.path().join("agent.log"),
    };
    agent.spawn();
    let drives = agent.ctl_drives();
    assert!(drive_by_path(&drives, &d.dev).is_none(), "loop device listed although allow_loop = false: {drives}");
    assert!(drives.as_array().unwrap().iter().all(|d| d["transport"] != "loop"));
}

#[test]
fn a_loop_device_over_a_block_device_is_not_a_drive() {
    require_host();
    let tmp = short_tempdir();
    let d = LoopDrive::new(tmp.path(), "disk.img", GIB);
    // What kubelet does for a block volume a pod uses: a loop device whose backing file
    // is the volume's device node.
    let over = LoopDrive { file: d.dev.clone(), dev: PathBuf::from(sh("losetup", &["--find", "--show", d.dev.to_str().unwrap()])) };
    sh("udevadm", &["settle"]);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let drives = agent.ctl_drives();
    assert!(drive_by_path(&drives, &d.dev).is_some(), "the loop over a file is a drive: {drives}");
    assert!(drive_by_path(&drives, &over.dev).is_none(), "{} over {} listed: {drives}", over.dev.display(), d.dev.display());
}
