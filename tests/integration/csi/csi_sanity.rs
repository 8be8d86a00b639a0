//! The community's CSI conformance suite, csi-sanity v5.4.0 (CSI spec v1.12), run as
//! shipped against the real binary on real loop drives, so a change that breaks it
//! cannot land.
//!
//! Rules:
//! - with the default configuration the suite ends with 0 failures, and runs its
//!   volume, node and listing specs (not a run that skipped everything);
//! - with `driver.advertise_volume_health = true` (CSI v1.13's health capabilities
//!   advertised) the suite's v1.12 capability checks are the only specs that fail: that
//!   is why the setting is off by default;
//! - the suite binary comes from `../shared/tools/csi-sanity.zst` (or the file named by
//!   `DRIVELET_CSI_SANITY`, an unpacked binary); if neither is there the test fails and
//!   says so: it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// The unpacked suite: `DRIVELET_CSI_SANITY`, else `../shared/tools/csi-sanity.zst`
/// unpacked once into the target directory.
fn suite() -> PathBuf {
    if let Ok(p) = std::env::var("DRIVELET_CSI_SANITY") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "DRIVELET_CSI_SANITY names {}, which is not a file", p.display());
        return p;
    }
    let packed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/csi-sanity.zst");
    assert!(
        packed.is_file(),
        "csi-sanity is not at {}: put the shared tools beside the project, or set DRIVELET_CSI_SANITY to an unpacked csi-sanity v5.4.0",
        packed.display()
    );
    // Beside the test binary (target/debug/deps/..): one copy per build, unpacked once.
    let dir = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("csi-sanity");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("csi-sanity-v5.4.0");
    if !out.is_file() {
        let tmp = dir.join(format!("csi-sanity.{}.tmp", std::process::id()));
        let st = Command::new("zstd")
            .args(["-dqf", packed.to_str().unwrap(), "-o", tmp.to_str().unwrap()])
            .status()
            .expect("zstd (scripts/setup-host.sh installs it)");
        assert!(st.success(), "zstd could not unpack {}", packed.display());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// The closing tally of a run.
#[derive(Debug, PartialEq)]
struct Tally {
    passed: u32,
    failed: u32,
    skipped: u32,
}

/// Reads `N Passed | N Failed | N Pending | N Skipped` from the suite's output.
fn tally(out: &str) -> Option<Tally> {
    let line = out.lines().rev().find(|l| l.contains(" Passed | ") && l.contains(" Failed | "))?;
    let n = |word: &str| -> Option<u32> {
        let at = line.find(&format!(" {word}"))?;
        line[..at].rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some(Tally { passed: n("Passed")?, failed: n("Failed")?, skipped: n("Skipped")? })
}

/// The names of the specs that failed (ginkgo's `[FAIL] ...` summary lines).
fn failures(out: &str) -> Vec<String> {
    let mut v: Vec<String> =
        out.lines().filter(|l| l.trim_start().starts_with("[FAIL]")).map(|l| l.trim().to_string()).collect();
    v.sort();
    v.dedup();
    v
}

/// Runs the suite against an agent over two fresh (sparse) 4 GiB loop drives, the
/// room its expansion specs grow a volume into (to testvolumesize plus 1 GiB); `env`
/// goes to the agent. Returns the suite's whole output and the agent's log.
fn run_suite(env: &[(&str, &str)]) -> (String, String) {
    require_host();
    let sanity = suite();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", 4 << 30);
    let _b = LoopDrive::new(tmp.path(), "b.img", 4 << 30);
    let kubelet = tmp.path().join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let agent = if env.is_empty() {
        Agent::start(tmp.path(), AgentOpts::default())
    } else {
        Agent::start_with(tmp.path(), AgentOpts::default(), env)
    };
    // The suite makes these itself and wants them absent; they must lie under the
    // agent's allowed roots.
    let out = Command::new(&sanity)
        .arg(format!("--csi.endpoint={}", agent.csi_socket.display()))
        .arg(format!("--csi.mountdir={}", kubelet.join("sanity-mount").display()))
        .arg(format!("--csi.stagingdir={}", kubelet.join("sanity-stage").display()))
        .arg("--csi.testvolumesize=67108864")
        .arg("--ginkgo.timeout=15m")
        .arg("--ginkgo.no-color")
        .output()
        .expect("run csi-sanity");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (text, agent.logs())
}

#[test]
fn the_community_conformance_suite_passes_with_the_default_configuration() {
    let (out, log) = run_suite(&[]);
    let t = tally(&out).unwrap_or_else(|| panic!("no tally line in csi-sanity's output:\n{out}"));
    println!("csi-sanity v5.4.0, default configuration: {} passed, {} failed, {} skipped", t.passed, t.failed, t.skipped);
    assert_eq!(t.failed, 0, "csi-sanity failed {} specs: {:#?}\n{out}\nagent log:\n{log}", t.failed, failures(&out));
    // A run that skipped its volume and node specs would pass too: make sure it ran them.
    assert!(t.passed >= 50, "only {} specs passed ({} skipped): the suite did not exercise the driver\n{out}", t.passed, t.skipped);
    // The snapshot specs run too (issue 25): fewer skips than the hostpath driver's 18.
    assert!(t.skipped < 18, "{} specs skipped: the snapshot specs did not run\n{out}", t.skipped);
}

#[test]
fn advertising_the_v1_13_health_capabilities_fails_only_the_suites_capability_checks() {
    let (out, _log) = run_suite(&[("DRIVELET__DRIVER__ADVERTISE_VOLUME_HEALTH", "true")]);
    let t = tally(&out).unwrap_or_else(|| panic!("no tally line in csi-sanity's output:\n{out}"));
    let failed = failures(&out);
    assert!(t.failed > 0, "with the v1.13 capabilities advertised csi-sanity v5.4.0 was expected to refuse them; it passed:\n{out}");
    for f in &failed {
        assert!(f.contains("GetCapabilities"), "a spec other than a capability check failed: {f}\n{out}");
    }
    assert!(out.contains("Unknown capability"), "the failures do not name the unknown capability:\n{out}");
}

#[test]
fn the_tally_line_is_read() {
    let out = "...\nRan 75 of 91 Specs in 12.3 seconds\nSUCCESS! -- 75 Passed | 0 Failed | 1 Pending | 15 Skipped\n";
    assert_eq!(tally(out), Some(Tally { passed: 75, failed: 0, skipped: 15 }));
    let out = "FAIL! -- 73 Passed | 2 Failed | 1 Pending | 15 Skipped\n  [FAIL] Node Service NodeGetCapabilities should return appropriate capabilities\n";
    assert_eq!(tally(out), Some(Tally { passed: 73, failed: 2, skipped: 15 }));
    assert_eq!(failures(out), vec!["[FAIL] Node Service NodeGetCapabilities should return appropriate capabilities".to_string()]);
}
