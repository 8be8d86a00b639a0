//! gRPC clients other than tonic against both of drivelet's gRPC sockets (CSI and
//! kubelet plugin registration) of the real binary, each client as it behaves by
//! default. The guard for the patched h2 in `vendor/h2` (see vendor/README.md): an
//! unpatched h2 resets every request whose `:authority` is not an RFC 3986 authority
//! with `RST_STREAM(PROTOCOL_ERROR)`, and these clients send such authorities.
//!
//! - gRPC C-core, through Python grpcio (`tests/interop/grpc_client.py`, raw request
//!   bytes, no generated stubs), twice: with no channel options (C-core's own default
//!   authority for a `unix://` target: the percent-encoded socket path without its
//!   leading slash, `tmp%2Fdlt...%2Fcsi.sock`, as grpcio 1.76 sends it), and with
//!   `grpc.default_authority` set to the socket path, which is what grpc-java
//!   (`DomainSocketAddress`) and kubelet's plugin-registration client (grpc-go dialled
//!   with a bare path) send. Identity, Node and registration calls must answer, a bad
//!   request must still get its gRPC status (INVALID_ARGUMENT), and with the option the
//!   agent's log must show that h2 saw exactly the socket paths and ignored them.
//! - A hand-written HTTP/2 client over the unix socket, independent of Python, sending
//!   the socket path, the C-core form and `localhost` (what grpc-go sends for a `unix:`
//!   target; the control that shows the client itself is right) as `:authority`. It is
//!   hand-written because the `h2` client cannot send such a request: it takes the
//!   authority from an `http::Uri`, whose authority parser refuses `/` and `%2F` (the
//!   parser the unpatched server applies, which is why it rejected them); nor is `h2` a
//!   dependency the tests can name. Only the request is encoded (HPACK literals without
//!   Huffman coding); of the reply it reads the frames, not the Huffman-coded headers.
//!
//! Python grpcio must be installed (scripts/setup-host.sh does it); without it the test
//! fails and says so, it never skips.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const DRIVER: &str = "csi.drivelet.io";

/// An agent with kubelet registration on (so it serves both gRPC sockets) and
/// kubelet's directory under the test directory; returns it with the registration
/// socket path.
fn start(dir: &Path) -> (Agent, PathBuf) {
    // The harness logs at debug level, so h2's "ignoring malformed authority" lines (the
    // patch's trace) land in the agent log.
    let (agent, reg) = Agent::start_registering(dir);
    assert!(is_socket(&agent.csi_socket), "no CSI socket; log:\n{}", agent.log_tail(20));
    assert!(is_socket(&reg), "no registration socket at {}; log:\n{}", reg.display(), agent.log_tail(20));
    (agent, reg)
}

/// The authority gRPC C-core sends by default for `unix://<path>`: the path without
/// its leading slash, each `/` percent-encoded.
fn c_core_default_authority(sock: &Path) -> String {
    sock.to_str().unwrap().trim_start_matches('/').replace('/', "%2F")
}

/// Every authority h2 logged as malformed and ignored (the patch's debug line), in
/// order.
fn ignored_authorities(agent: &Agent) -> Vec<String> {
    agent
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let m = v["message"].as_str()?;
            let rest = m.strip_prefix("ignoring malformed authority (b\"")?;
            Some(rest.split("\")").next()?.to_string())
        })
        .collect()
}

/// What h2 logged about authorities (patched: "ignoring malformed authority",
/// unpatched: "malformed headers: malformed authority"), distinct, for failure
/// messages.
fn h2_authority_lines(agent: &Agent) -> String {
    let mut out: Vec<String> = Vec::new();
    for v in agent.logs().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
        let m = v["message"].as_str().unwrap_or_default();
        if m.contains("malformed authority") && !out.iter().any(|o| o == m) {
            out.push(m.to_string());
        }
    }
    if out.is_empty() {
        "(none)".into()
    } else {
        out.join("\n")
    }
}

/// Fails with every failed call at once, the hint and what h2 logged.
fn assert_no_failures(client: &str, failures: &[String], agent: &Agent) {
    assert!(
        failures.is_empty(),
        "{client}: {} call(s) failed:\n{}\n\nA stream reset (RST_STREAM with PROTOCOL_ERROR; grpcio reports it as \
         INTERNAL) means h2 refused the :authority: is the vendor/h2 patch in effect ([patch.crates-io] in \
         Cargo.toml, see vendor/README.md)?\nh2 logged:\n{}\nagent log:\n{}",
        failures.len(),
        failures.join("\n"),
        h2_authority_lines(agent),
        agent.log_tail(10)
    );
}

// ---- protobuf, decoded by hand ----

#[derive(Debug, PartialEq)]
enum Field {
    Varint(u64),
    Bytes(Vec<u8>),
    Fixed(Vec<u8>),
}

fn read_varint(b: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first().expect("truncated varint");
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return v;
        }
    }
    panic!("varint longer than 10 bytes");
}

/// The (field number, value) pairs of a protobuf message.
fn fields(mut b: &[u8]) -> Vec<(u64, Field)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = read_varint(&mut b);
        let value = match key & 7 {
            0 => Field::Varint(read_varint(&mut b)),
            2 => {
                let n = read_varint(&mut b) as usize;
                assert!(n <= b.len(), "length-delimited field {} overruns the message", key >> 3);
                let (v, rest) = b.split_at(n);
                b = rest;
                Field::Bytes(v.to_vec())
            }
            w @ (1 | 5) => {
                let n = if w == 1 { 8 } else { 4 };
                let (v, rest) = b.split_at(n);
                b = rest;
                Field::Fixed(v.to_vec())
            }
            w => panic!("wire type {w} in field {}", key >> 3),
        };
        out.push((key >> 3, value));
    }
    out
}

fn bytes_field(msg: &[u8], n: u64) -> Option<Vec<u8>> {
    fields(msg).into_iter().find_map(|(k, v)| match v {
        Field::Bytes(b) if k == n => Some(b),
        _ => None,
    })
}

fn string_field(msg: &[u8], n: u64) -> Option<String> {
    bytes_field(msg, n).map(|b| String::from_utf8(b).expect("string field is UTF-8"))
}

fn varint_field(msg: &[u8], n: u64) -> Option<u64> {
    fields(msg).into_iter().find_map(|(k, v)| match v {
        Field::Varint(x) if k == n => Some(x),
        _ => None,
    })
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex {s:?}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

// ---- Python grpcio (gRPC C-core) ----

fn python_client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/grpc_client.py")
}

/// Fails (never skips) when python3 or its grpc package is missing; returns the grpcio
/// version.
fn require_grpcio() -> String {
    let out = Command::new("python3")
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}): run scripts/setup-host.sh, which installs python3 and grpcio"));
    assert!(
        out.status.success(),
        "python3 cannot import grpc (the Python package grpcio, the gRPC C-core client this test needs): \
         run scripts/setup-host.sh\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs the Python client in `mode` ("default" or "socket-path") against both sockets
/// and returns its calls.
fn python_calls(mode: &str, csi: &Path, reg: &Path) -> Vec<Value> {
    let out = Command::new("python3").arg(python_client()).arg(mode).arg(csi).arg(reg).output().expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(3), "python3 cannot import grpc: run scripts/setup-host.sh\n{stderr}");
    assert!(out.status.success(), "tests/interop/grpc_client.py {mode} failed ({}):\n{stderr}", out.status);
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("grpc_client.py printed no JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout)));
    v["calls"].as_array().expect("calls").clone()
}

/// Checks one call of the Python client: its gRPC code and its decoded response.
fn check_python_call(c: &Value, agent: &Agent) -> Result<(), String> {
    let method = c["method"].as_str().unwrap();
    let code = c["code"].as_str().unwrap();
    let ctx = format!("{method} on the {} socket with :authority {}", c["socket"].as_str().unwrap(), c["authority"].as_str().unwrap());
    let want = if method.ends_with("/DeleteVolume") { "INVALID_ARGUMENT" } else { "OK" };
    if code != want {
        return Err(format!("{ctx}: {code} {:?}, expected {want}", c["details"].as_str().unwrap_or_default()));
    }
    let resp = hex(c["response_hex"].as_str().unwrap());
    let check = |what: &str, got: Option<String>, want: &str| match got {
        Some(g) if g == want => Ok(()),
        g => Err(format!("{ctx}: {what} is {g:?}, expected {want:?} (response {resp:02x?})")),
    };
    match method {
        "/csi.v1.Identity/GetPluginInfo" => check("GetPluginInfoResponse.name", string_field(&resp, 1), DRIVER),
        "/csi.v1.Identity/Probe" => {
            // ProbeResponse.ready is a google.protobuf.BoolValue (its field 1 = value).
            let ready = bytes_field(&resp, 1).and_then(|b| varint_field(&b, 1));
            check("ProbeResponse.ready", ready.map(|r| (r == 1).to_string()), "true")
        }
        "/csi.v1.Node/NodeGetInfo" => check("NodeGetInfoResponse.node_id", string_field(&resp, 1), NODE),
        "/csi.v1.Controller/DeleteVolume" => {
            let details = c["details"].as_str().unwrap();
            if details.contains("volume_id") {
                Ok(())
            } else {
                Err(format!("{ctx}: the INVALID_ARGUMENT does not name volume_id: {details:?}"))
            }
        }
        "/pluginregistration.Registration/GetInfo" => {
            check("PluginInfo.type", string_field(&resp, 1), "CSIPlugin")?;
            check("PluginInfo.name", string_field(&resp, 2), DRIVER)?;
            check("PluginInfo.endpoint", string_field(&resp, 3), agent.csi_socket.to_str().unwrap())
        }
        "/pluginregistration.Registration/NotifyRegistrationStatus" if resp.is_empty() => Ok(()),
        "/pluginregistration.Registration/NotifyRegistrationStatus" => {
            Err(format!("{ctx}: RegistrationStatusResponse is not empty: {resp:02x?}"))
        }
        other => Err(format!("grpc_client.py made a call this test does not check: {other}")),
    }
}

#[test]
fn python_grpcio_calls_both_sockets_with_its_default_and_a_socket_path_authority() {
    require_host();
    let grpcio = require_grpcio();
    let tmp = short_tempdir();
    let (agent, reg) = start(tmp.path());
    let csi = agent.csi_socket.clone();
    let t0 = Instant::now();

    // C-core as it comes (no channel options), then with grpc-java's and kubelet's
    // authority, the socket path itself.
    let mut failures = Vec::new();
    let mut ignored = Vec::new();
    for mode in ["default", "socket-path"] {
        let before = ignored_authorities(&agent).len();
        let calls = python_calls(mode, &csi, &reg);
        assert_eq!(calls.len(), 6, "grpc_client.py {mode}: {calls:?}");
        failures.extend(calls.iter().filter_map(|c| check_python_call(c, &agent).err()));
        ignored.push(ignored_authorities(&agent).split_off(before));
    }
    assert_no_failures(&format!("gRPC C-core (Python grpcio {grpcio})"), &failures, &agent);

    // Not asserted: another grpcio may pick another default; that it works is the point.
    eprintln!("grpcio {grpcio}, no options: h2 ignored the authorities {:?}", ignored[0]);
    let want = [csi.to_str().unwrap(), reg.to_str().unwrap()];
    for w in want {
        assert!(
            ignored[1].iter().any(|s| s == w),
            "the socket path {w} never reached h2 as the :authority (ignored: {:?}): the test no longer \
             exercises the case the vendor/h2 patch exists for; h2 logged:\n{}",
            ignored[1],
            h2_authority_lines(&agent)
        );
    }
    assert!(ignored[1].iter().all(|s| want.contains(&s.as_str())), "h2 ignored unexpected authorities: {:?}", ignored[1]);
    // The registrar logs kubelet's report on its own; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !agent.logs().contains("kubelet registered the plugin") {
        assert!(Instant::now() < deadline, "NotifyRegistrationStatus was not logged; log:\n{}", agent.log_tail(20));
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("grpcio {grpcio}: 12 calls in {:?}", t0.elapsed());
}

// ---- a raw HTTP/2 client ----

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// An HPACK integer with a `prefix`-bit prefix (RFC 7541 5.1) after the bits `flags`.
fn hpack_int(out: &mut Vec<u8>, mut v: usize, prefix: u32, flags: u8) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A literal header field without indexing, new name, no Huffman coding (RFC 7541
/// 6.2.2): the server decodes exactly these bytes, whatever they hold.
fn hpack_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    for s in [name, value] {
        hpack_int(out, s.len(), 7, 0);
        out.extend_from_slice(s.as_bytes());
    }
}

fn frame(out: &mut Vec<u8>, ty: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// What the server answered on stream 1.
#[derive(Debug, Default)]
struct RawReply {
    /// The response header block (HPACK, as sent).
    headers: Option<Vec<u8>>,
    /// The DATA payloads, concatenated (gRPC length-prefixed messages).
    data: Vec<u8>,
    /// Stream 1 ended with END_STREAM.
    ended: bool,
    /// RST_STREAM error code on stream 1.
    reset: Option<u32>,
    /// GOAWAY error code.
    goaway: Option<u32>,
}

fn reason(code: u32) -> &'static str {
    match code {
        0 => "NO_ERROR",
        1 => "PROTOCOL_ERROR",
        2 => "INTERNAL_ERROR",
        7 => "REFUSED_STREAM",
        8 => "CANCEL",
        _ => "other",
    }
}

/// One unary gRPC call with an empty request message, `authority` as `:authority`,
/// over a fresh connection to `sock`.
fn raw_grpc(sock: &Path, authority: &str, path: &str) -> RawReply {
    let mut s = UnixStream::connect(sock).unwrap_or_else(|e| panic!("connect {}: {e}", sock.display()));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        hpack_literal(&mut block, n, v);
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, SETTINGS, 0, 0, &[]);
    frame(&mut out, HEADERS, END_HEADERS, 1, &block);
    // One gRPC message: not compressed, length 0.
    frame(&mut out, DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]);
    s.write_all(&out).unwrap();

    let mut reply = RawReply::default();
    loop {
        let mut head = [0u8; 9];
        match s.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return reply,
            Err(e) => panic!("reading from {} (authority {authority:?}): {e}; so far {reply:?}", sock.display()),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (ty, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).unwrap();
        let mut body = &payload[..];
        if matches!(ty, DATA | HEADERS) && flags & PADDED != 0 {
            let pad = body[0] as usize;
            body = &body[1..body.len() - pad];
        }
        match ty {
            SETTINGS if flags & ACK == 0 => {
                let mut ack = Vec::new();
                frame(&mut ack, SETTINGS, ACK, 0, &[]);
                s.write_all(&ack).unwrap();
            }
            PING if flags & ACK == 0 => {
                let mut pong = Vec::new();
                frame(&mut pong, PING, ACK, 0, body);
                s.write_all(&pong).unwrap();
            }
            HEADERS if stream == 1 => {
                if flags & PRIORITY != 0 {
                    body = &body[5..];
                }
                assert!(flags & END_HEADERS != 0, "the server split its headers into CONTINUATION frames; this client does not join them");
                if reply.headers.is_none() {
                    reply.headers = Some(body.to_vec());
                }
                if flags & END_STREAM != 0 {
                    reply.ended = true;
                    return reply;
                }
            }
            CONTINUATION => panic!("unexpected CONTINUATION frame"),
            DATA if stream == 1 => {
                reply.data.extend_from_slice(body);
                if flags & END_STREAM != 0 {
                    reply.ended = true;
                    return reply;
                }
            }
            RST_STREAM if stream == 1 => {
                reply.reset = Some(u32::from_be_bytes(body[..4].try_into().unwrap()));
                return reply;
            }
            GOAWAY => {
                let code = u32::from_be_bytes(body[4..8].try_into().unwrap());
                reply.goaway = Some(code);
                if code != 0 {
                    return reply;
                }
            }
            _ => {}
        }
    }
}

/// The one gRPC message of a successful unary reply, or what went wrong.
fn raw_message(sock: &Path, authority: &str, path: &str) -> Result<Vec<u8>, String> {
    let r = raw_grpc(sock, authority, path);
    let ctx = format!("{path} on {} with :authority {authority:?}", sock.display());
    if let Some(code) = r.reset {
        return Err(format!("{ctx}: the server reset the stream with {} ({code})", reason(code)));
    }
    if let Some(code) = r.goaway.filter(|&c| c != 0) {
        return Err(format!("{ctx}: GOAWAY {} ({code})", reason(code)));
    }
    // h2 encodes `:status: 200` as indexed field 8 of the HPACK static table (0x88) and
    // sends it first. (The rest, and the grpc-status trailer, are Huffman-coded, which
    // this client does not decode; tonic sends a reply message only with status OK.)
    if r.headers.as_deref().and_then(|h| h.first()) != Some(&0x88) {
        return Err(format!("{ctx}: no `:status: 200` response headers: {r:?}"));
    }
    if !r.ended {
        return Err(format!("{ctx}: the stream did not end: {r:?}"));
    }
    let n = match r.data.get(..5) {
        Some([0, len @ ..]) => u32::from_be_bytes(len.try_into().unwrap()) as usize,
        _ => return Err(format!("{ctx}: no uncompressed gRPC message in the reply: {r:?}")),
    };
    if r.data.len() != 5 + n {
        return Err(format!("{ctx}: not exactly one gRPC message in the reply: {r:?}"));
    }
    Ok(r.data[5..].to_vec())
}

/// (socket, method, the string fields the reply must hold: number and value).
type RawCall<'a> = (&'a Path, &'a str, &'a [(u64, &'a str)]);

#[test]
fn raw_http2_requests_with_a_socket_path_authority_are_served_on_both_sockets() {
    require_host();
    let tmp = short_tempdir();
    let (agent, reg) = start(tmp.path());
    let csi = agent.csi_socket.clone();
    let t0 = Instant::now();
    let before = ignored_authorities(&agent).len();
    let mut expect_ignored = Vec::new();
    let calls: [RawCall; 3] = [
        (&csi, "/csi.v1.Identity/GetPluginInfo", &[(1, DRIVER)]),
        (&csi, "/csi.v1.Node/NodeGetInfo", &[(1, NODE)]),
        (&reg, "/pluginregistration.Registration/GetInfo", &[(1, "CSIPlugin"), (2, DRIVER)]),
    ];
    let mut failures = Vec::new();
    for (sock, method, want) in calls {
        for authority in [sock.to_str().unwrap().to_string(), c_core_default_authority(sock), "localhost".to_string()] {
            let checked = raw_message(sock, &authority, method).and_then(|msg| {
                let got: Vec<(u64, Option<String>)> = want.iter().map(|&(n, _)| (n, string_field(&msg, n))).collect();
                if want.iter().zip(&got).all(|((_, w), (_, g))| g.as_deref() == Some(*w)) {
                    Ok(())
                } else {
                    Err(format!("{method} with :authority {authority:?}: fields {got:?}, expected {want:?}"))
                }
            });
            failures.extend(checked.err());
            if authority != "localhost" {
                expect_ignored.push(authority);
            }
        }
    }
    assert_no_failures("raw HTTP/2 client", &failures, &agent);

    // h2 saw every one of these authorities, refused to parse it and served the request;
    // `localhost` it parsed.
    let seen: Vec<String> = ignored_authorities(&agent).split_off(before);
    assert_eq!(seen, expect_ignored, "authorities h2 logged as ignored; log:\n{}", agent.log_tail(20));
    eprintln!("raw HTTP/2: 9 calls in {:?}", t0.elapsed());
}
