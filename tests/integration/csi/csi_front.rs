//! The agent as a process an operator runs: its sockets are owner-only and stale ones
//! replaced, `check-config` names the key to change, start-up errors are clear and change
//! nothing, `--help` documents every command, and the `csi` client prints capabilities
//! and sizes in plain words. (What the CSI services answer, field by field, is the
//! conformance suite's.)

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::*;

#[test]
fn sockets_are_owner_only_and_stale_ones_are_replaced() {
    require_host();
    let tmp = short_tempdir();
    // A stale socket from a crashed run.
    let stale = std::os::unix::net::UnixListener::bind(tmp.path().join("csi.sock")).unwrap();
    drop(stale);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    for s in [&agent.csi_socket, &agent.admin_socket] {
        let mode = std::fs::metadata(s).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} mode {mode:o}", s.display());
    }
    // A second agent on the same sockets refuses to start and says why.
    let out = Command::new(bin()).args(["run", "--config", agent.config.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another running process"), "{err}");
    assert!(is_socket(&agent.csi_socket), "the running agent's socket was left alone");
    assert_eq!(agent.stop(), 0);
}

/// Kills a process this test started when dropped.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::Signal::SIGKILL);
    }
}

#[test]
fn a_socket_whose_listener_exited_is_stale_even_while_a_child_of_it_still_holds_it() {
    require_host();
    let tmp = short_tempdir();
    let csi = tmp.path().join("csi.sock");
    // As after a `kill -9` of an agent that was starting a tool: the agent (here a
    // Python process) listened on the socket and is gone, but the child it forked still
    // holds the listening socket until its exec closes it.
    let script = [
        "import os, socket, sys, time",
        "s = socket.socket(socket.AF_UNIX)",
        "s.bind(sys.argv[1])",
        "s.listen()",
        "pid = os.fork()",
        "if pid == 0:",
        "    null = os.open('/dev/null', os.O_RDWR)",
        "    for fd in (0, 1, 2):",
        "        os.dup2(null, fd)",
        "    time.sleep(60)",
        "    os._exit(0)",
        "print(pid, flush=True)",
    ]
    .join("\n");
    let out = Command::new("python3").args(["-c", &script, csi.to_str().unwrap()]).output().expect("python3");
    assert!(out.status.success(), "python3: {}", String::from_utf8_lossy(&out.stderr));
    let holder = KillOnDrop(String::from_utf8_lossy(&out.stdout).trim().parse().expect("the child's pid"));
    assert!(std::os::unix::net::UnixStream::connect(&csi).is_ok(), "the orphaned listener still accepts connections");

    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    assert!(agent.logs().contains("has exited"), "the log says why the socket was replaced:\n{}", agent.log_tail(20));
    let mode = std::fs::metadata(&agent.csi_socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the new socket is owner-only");
    // The agent serves on the new socket (Agent::start waited for Probe on it); the
    // orphan's copy is no longer reachable by path.
    drop(holder);
    assert_eq!(agent.stop(), 0);
}

fn check_config(toml: &str, env: &[(&str, &str)]) -> (i32, String) {
    let tmp = short_tempdir();
    let p = tmp.path().join("c.toml");
    std::fs::write(&p, toml).unwrap();
    let out = Command::new(bin())
        .args(["check-config", p.to_str().unwrap()])
        .env("NODE_NAME", "n1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn check_config_accepts_good_files_and_names_the_key_in_bad_ones() {
    let root = env!("CARGO_MANIFEST_DIR");
    for f in ["config/drivelet.toml", "config/demo.toml"] {
        let out = Command::new(bin()).args(["check-config", &format!("{root}/{f}")]).env("NODE_NAME", "n1").output().unwrap();
        assert!(out.status.success(), "{f}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let (code, out) = check_config("", &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node n1"), "NODE_NAME is the node name: {out}");

    let cases: &[(&str, &[(&str, &str)], &str)] = &[
        ("[driver]\nnmae = \"x\"\n", &[], "nmae"),
        ("[drives.filters]\nmin_size = \"lots\"\n", &[], "not a size"),
        ("[drives]\nrescan_interval = \"often\"\n", &[], "not a duration"),
        ("[paths]\ncsi_socket = \"rel/csi.sock\"\n", &[], "paths.csi_socket"),
        ("[driver]\nname = \"bad_name!\"\n", &[], "driver.name"),
        ("", &[("DRIVELET__DRIVER__NAME", "-nope-")], "driver.name"),
        ("", &[("DRIVELET__DRIVES__ALLOW_LOOP", "maybe")], "allow_loop"),
        ("[demo]\nenabled = true\n", &[], "drives.allow_loop"),
        ("this is not toml", &[], "c.toml"),
    ];
    for (toml, env, want) in cases {
        let (code, out) = check_config(toml, env);
        assert_eq!(code, 1, "{toml:?} {env:?} should be rejected: {out}");
        assert!(out.contains(want), "{toml:?} {env:?}: message should mention {want:?}: {out}");
        assert!(!out.contains("panicked"), "{out}");
    }
    let (code, out) = check_config("", &[("DRIVELET__DRIVER__NODE_NAME", "from-env")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node from-env"), "{out}");
}

#[test]
fn a_command_whose_reader_went_away_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    // `drivelet check-config … | head -0`: the pipe's reader is gone before anything is
    // printed. The command ends by SIGPIPE, as other Unix tools do, and panics not.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(bin())
        .args(["check-config", &format!("{root}/config/demo.toml")])
        .env("NODE_NAME", "n1")
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "a broken pipe is no panic: {err}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "ended by the broken pipe: {:?} {err}", out.status);
}

#[test]
fn startup_errors_are_clear_and_change_nothing() {
    require_host();
    let tmp = short_tempdir();
    // The socket directory cannot be created: a regular file sits where it should be.
    std::fs::write(tmp.path().join("blocker"), b"keep me").unwrap();
    let cfg = tmp.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[driver]\nnode_name = \"n\"\n[paths]\ncsi_socket = \"{d}/blocker/csi.sock\"\nadmin_socket = \"{d}/admin.sock\"\nstate_dir = \"{d}/state\"\n",
            d = tmp.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(bin()).args(["run", "--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot create socket directory") && err.contains("blocker"), "{err}");
    assert_eq!(std::fs::read(tmp.path().join("blocker")).unwrap(), b"keep me");

    // A regular file at the socket path is never deleted.
    std::fs::write(tmp.path().join("csi.sock"), b"not a socket").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[driver]\nnode_name = \"n\"\n[paths]\ncsi_socket = \"{d}/csi.sock\"\nadmin_socket = \"{d}/admin.sock\"\nstate_dir = \"{d}/state\"\n",
            d = tmp.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(bin()).args(["run", "--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(tmp.path().join("csi.sock")).unwrap(), b"not a socket");
}

#[test]
fn help_documents_every_command() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "check-config", "ctl", "csi"] {
        assert!(help.contains(cmd), "{cmd} missing from --help:\n{help}");
    }
    let out = Command::new(bin()).args(["ctl", "--help"]).output().unwrap();
    let ctl = String::from_utf8_lossy(&out.stdout);
    assert!(ctl.contains("drives") && ctl.contains("volumes"), "{ctl}");
    let out = Command::new(bin()).args(["csi", "--help"]).output().unwrap();
    let csi = String::from_utf8_lossy(&out.stdout);
    for sub in ["create", "delete", "get", "list", "validate", "capacity", "stage", "unstage", "publish", "unpublish", "stats", "info"] {
        assert!(csi.contains(sub), "csi {sub} missing:\n{csi}");
    }
}

#[test]
fn csi_cli_prints_capabilities_by_their_csi_names_and_sizes_in_binary_units() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", 2 * GIB);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let csi = |args: &[&str]| {
        let sock = agent.csi_socket.display().to_string();
        let out = Command::new(bin()).args(["csi", "--endpoint", sock.as_str()]).args(args).output().unwrap();
        assert!(out.status.success(), "csi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let info = csi(&["info"]);
    for want in [
        "plugin_capabilities: CONTROLLER_SERVICE, VOLUME_ACCESSIBILITY_CONSTRAINTS, VOLUME_EXPANSION_ONLINE\n",
        "CREATE_DELETE_VOLUME",
        "GET_CAPACITY",
        "STAGE_UNSTAGE_VOLUME",
        "ready: true\n",
        "topology: topology.drivelet.io/node=test-node, topology.kubernetes.io/zone=zone-a\n",
    ] {
        assert!(info.contains(want), "{want:?} not in:\n{info}");
    }
    for debug in ["Some(", "Rpc", "r#type", "{"] {
        assert!(!info.contains(debug), "Debug output {debug:?} in:\n{info}");
    }
    let cap = csi(&["capacity"]);
    assert!(cap.contains("available_capacity: 2.0 GiB\n") && cap.contains("maximum_volume_size: 2.0 GiB\n"), "{cap}");
    // JSON keeps the exact bytes.
    let json: serde_json::Value = serde_json::from_str(&csi(&["-o", "json", "capacity"])).unwrap();
    assert!(json["available_capacity"].as_u64().is_some_and(|b| b > GIB && b <= 2 * GIB), "{json}");
}
