//! The fuzz engine: every target of `drivelet::fuzz` (one per parser of bytes drivelet
//! did not write) fed its seed corpus, then mutants of it, for a bounded time, on
//! stable Rust. One test per target, so `cargo test --test fuzz gpt` runs one.
//!
//! Rules:
//! - a target fails on a panic (each input under `catch_unwind`), a hang (one input
//!   running longer than [`Settings::hang`]), an allocation of more than
//!   [`MAX_ALLOCATION`] bytes at once, or more than [`MAX_LIVE`] bytes live at once,
//!   while it runs one input (a counting allocator, per thread);
//! - every seed in `tests/fuzz/corpus/<target>/` runs first, as it is: a seed that
//!   fails is a regression; then mutants (bit flips, interesting values at the fields
//!   of the formats' magic numbers, inserted and deleted bytes, splices of two seeds,
//!   tokens of the format) until the time is up;
//! - deterministic: the mutants follow from the seed of the random numbers
//!   (`DRIVELET_FUZZ_SEED`, printed), so a run is repeated by naming it; a failing input
//!   is saved to a file whose path is printed, and `DRIVELET_FUZZ_REPLAY=FILE` runs it
//!   alone;
//! - `DRIVELET_FUZZ_SECS` (default 2) is each target's time; `scripts/fuzz.sh` runs
//!   longer; `DRIVELET_FUZZ_SECS=0` runs the seeds alone and prints each one's time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most bytes one allocation may ask for while an input runs: every size a parser takes
/// from its input must be bounded below this before it allocates.
const MAX_ALLOCATION: usize = 16 << 20;
/// Most bytes that may be live at once (above what was live before the input).
const MAX_LIVE: isize = 64 << 20;
/// An allocation above this is refused outright (the process then stops with
/// "memory allocation failed"), after the input is saved: the machine is shared.
const REFUSE_ABOVE: usize = 1 << 30;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static BIGGEST: Cell<usize> = const { Cell::new(0) };
    /// The input running and where to save it, for an allocation refused outright.
    static CURRENT: Cell<(*const u8, usize, *const libc::c_char)> = const { Cell::new((std::ptr::null(), 0, std::ptr::null())) };
}

/// The system allocator, counting what the thread running an input allocates.
struct Counting;

impl Counting {
    /// Counts `grow` more bytes (a request of `size` bytes); false to refuse it.
    fn count(size: usize, grow: isize) -> bool {
        let Ok(armed) = ARMED.try_with(Cell::get) else { return true };
        if !armed {
            return true;
        }
        if size > REFUSE_ABOVE {
            save_current_raw(size);
            return false;
        }
        let _ = BIGGEST.try_with(|b| b.set(b.get().max(size)));
        let _ = LIVE.try_with(|l| {
            l.set(l.get() + grow);
            let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
        });
        true
    }

    fn uncount(size: usize) {
        if ARMED.try_with(Cell::get).unwrap_or(false) {
            let _ = LIVE.try_with(|l| l.set(l.get() - size as isize));
        }
    }
}

/// Saves the running input with nothing but system calls (inside the allocator).
fn save_current_raw(size: usize) {
    let Ok((ptr, len, path)) = CURRENT.try_with(Cell::get) else { return };
    // SAFETY: `ptr`/`len` and `path` are set by `run_one` from an input and a C string
    // that outlive the call running the input, and cleared after it.
    unsafe {
        let msg = b"\nfuzz: an allocation of more than 1 GiB was refused; the input is saved as the target's failure file\n";
        libc::write(2, msg.as_ptr().cast(), msg.len());
        let _ = size;
        if !ptr.is_null() && !path.is_null() {
            let fd = libc::open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
            if fd >= 0 {
                libc::write(fd, ptr.cast(), len);
                libc::close(fd);
            }
        }
    }
}

// SAFETY: every call goes to the system allocator unchanged, or is refused with null as
// GlobalAlloc allows; the counting touches only const-initialised thread locals.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if !Self::count(l.size(), l.size() as isize) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout is passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if !Self::count(l.size(), l.size() as isize) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        Self::uncount(l.size());
        // SAFETY: `p` was allocated by System with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if !Self::count(new, new as isize - l.size() as isize) {
            return std::ptr::null_mut();
        }
        // SAFETY: `p` was allocated by System with `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A small, fast, seedable generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// How a target runs, from the environment.
struct Settings {
    secs: f64,
    seed: u64,
    hang: Duration,
    replay: Option<PathBuf>,
    out: PathBuf,
}

impl Settings {
    fn from_env() -> Settings {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let secs = var("DRIVELET_FUZZ_SECS").map(|v| v.parse().unwrap_or_else(|_| panic!("DRIVELET_FUZZ_SECS={v}: not a number of seconds"))).unwrap_or(2.0);
        let seed = var("DRIVELET_FUZZ_SEED").map(|v| v.parse().unwrap_or_else(|_| panic!("DRIVELET_FUZZ_SEED={v}: not a number"))).unwrap_or(0x5eed);
        let hang = Duration::from_millis(var("DRIVELET_FUZZ_HANG_MS").map(|v| v.parse().expect("DRIVELET_FUZZ_HANG_MS: milliseconds")).unwrap_or(10_000));
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let out = var("DRIVELET_FUZZ_OUT").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join(format!("drivelet-fuzz-{uid}")));
        Settings { secs, seed, hang, replay: var("DRIVELET_FUZZ_REPLAY").map(PathBuf::from), out }
    }
}

/// What makes a mutant of each target worth more than random bytes.
struct Shape {
    /// Longest input.
    max_len: usize,
    /// Magic numbers whose fields get interesting values.
    magics: &'static [&'static [u8]],
    /// Tokens of the format, inserted or written over.
    tokens: &'static [&'static str],
}

const JSON: &[&str] = &[
    "{", "}", "[", "]", "\"", ":", ",", "null", "true", "false", "-1", "0", "1e999", "-0.0", "18446744073709551616", "-9223372036854775809",
    "\"\\u0000\"", "\"\\ud800\"", "\"\\n\"", "{\"a\":", "[[[[[[[[", "]]]]]]]]", "4294967295", "\"../../etc\"",
];
const BINARY: &[&[u8]] = &[b"EFI PART", b"DRVLNOTE", b"DRVLDRTY", b"DRVLSNAP", b"DRVLKEY1", b"\x55\xaa"];

fn shape(target: &str) -> Shape {
    let text = |tokens| Shape { max_len: 64 << 10, magics: &[], tokens };
    match target {
        "gpt" => Shape { max_len: 256 << 10, magics: BINARY, tokens: &[] },
        "mbr" => Shape { max_len: 64 << 10, magics: &[b"\x55\xaa"], tokens: &["\x05", "\x0f", "\x07", "\x00\x00\x00\x00"] },
        "note" | "journal" | "snapshot_note" => Shape { max_len: 300 << 10, magics: BINARY, tokens: JSON },
        "key_header" => Shape { max_len: 4 << 10, magics: BINARY, tokens: &["\x01\x00\x00\x00", "\x02\x00\x00\x00", "\x7f\x7f\x7f\x7f"] },
        "mountinfo" => text(&[" - ", "\\040", "\\134", "\\", "\n", " ", ":", "subvol=", "subvol=/@", "/", "0:0", "4294967296:1", " shared:1", "/dev/", "rw,relatime"]),
        "udev" => text(&[
            "\n", "=", "DEVNAME=/dev/", "ID_WWN=", "ID_WWN_WITH_EXTENSION=", "ID_SERIAL=", "ID_BUS=", "ID_PATH=", "-sas-", "ID_FS_TYPE=", "ID_FS_TYPE=bcache",
            "ID_PART_TABLE_TYPE=gpt", "ID_PART_TABLE_UUID=6472766c-", "ID_CDROM=1", "DEVLINKS=", "loop", "nvme", "vd", "SIZE=0", "SIZE=18446744073709551615",
            "BACKING_FILE=", "MAJOR=", "MINOR=4294967296", "ID_PART_ENTRY_UUID=", "ID_PART_ENTRY_TYPE=df8e4bd2-b4f6-46af-b301-8bcbff739f75",
            "ID_PART_ENTRY_NAME=drivelet:", "ID_PART_ENTRY_OFFSET=", "ID_PART_ENTRY_SIZE=", "\u{1F600}", "\u{202e}",
        ]),
        "smartctl" | "admin_request" | "store_record" => text(JSON),
        "freeze_record" => text(&["drivelet freeze 1\n", "device ", "path /", ":", "\n", "4294967296", "\u{0}"]),
        "blkid" => text(&["TYPE=", "PTTYPE=", "USAGE=", "VERSION=", "\n", "=", "dos", "gpt", "PMBR", "ext4", "linux_raid_member", "crypto_LUKS", "bcache", "swap", "raid", "crypto", "other"]),
        "dumpe2fs" => text(&[
            "Block size:", "Block count:", "First block:", "Blocks per group:", "Inode blocks per group:", "Reserved GDT blocks:", "Group descriptor size:",
            "Filesystem features:", " sparse_super", "Filesystem state:", "clean", "\n", "0", "1", "18446744073709551615", "4096", "1024", "65536",
        ]),
        "config" => text(&[
            "[", "]", "=", "\"", "\n", "'", "{", "}", "[drives]", "[driver]", "[health]", "[kubernetes]", "1Gi", "0s", "99999999999999999999Ti", "-1", "true",
            "18446744073709551615", "1e308", "[[a]]", "\"\"\"", "\\u0000", "0x", "inf", "nan",
        ]),
        "migration_pv" => text(&[": ", "- ", "\n  ", "\n", "{", "}", "local:", "path: ", "nodeAffinity:", "csi:", "volumeHandle: ", "&a ", "*a", "!!binary ", "<<: *a", "..", "/", "\"", "'"]),
        other => panic!("no shape for target {other}"),
    }
}

const U8S: &[u8] = &[0, 1, 2, 0x7f, 0x80, 0xfe, 0xff];
const U16S: &[u16] = &[0, 1, 0x7fff, 0x8000, 0xffff, 92, 128, 512, 4096];
const U32S: &[u32] = &[0, 1, 2, 36, 92, 127, 128, 129, 256, 512, 1024, 4096, 4097, 65536, 0x7fff_ffff, 0x8000_0000, 0xffff_fffe, 0xffff_ffff];
const U64S: &[u64] = &[0, 1, 2, 33, 34, 2047, 2048, 1 << 20, (1 << 32) - 1, 1 << 32, 1 << 52, 1 << 62, i64::MAX as u64, 1 << 63, u64::MAX - 1, u64::MAX];

/// Offsets worth a mutation: the fields after each magic number (a GPT header's
/// counts and LBAs, a slot's length and CRC) and, after a GPT header, its first
/// entries' fields.
fn hot_offsets(input: &[u8], magics: &[&[u8]]) -> Vec<usize> {
    let mut out = Vec::new();
    for m in magics {
        let mut from = 0;
        while let Some(i) = input[from..].windows(m.len()).position(|w| w == *m) {
            let at = from + i;
            out.extend((0..96).step_by(4).map(|o| at + o));
            if *m == b"EFI PART" {
                for e in 0..4 {
                    out.extend([0, 16, 32, 40, 48, 56, 58].iter().map(|o| at + 512 + 128 * e + o));
                }
            }
            from = at + 1;
            if out.len() > 4096 {
                break;
            }
        }
    }
    out.retain(|&o| o < input.len());
    out
}

fn mutate(rng: &mut Rng, base: &[u8], corpus: &[(String, Vec<u8>)], shape: &Shape) -> Vec<u8> {
    let mut v = base.to_vec();
    let hot = hot_offsets(&v, shape.magics);
    let rounds = 1 << rng.below(4);
    for _ in 0..rounds {
        let pos = |rng: &mut Rng, v: &Vec<u8>, width: usize| -> Option<usize> {
            if v.len() < width {
                return None;
            }
            if !hot.is_empty() && rng.chance(2) {
                let o = hot[rng.below(hot.len())];
                return (o + width <= v.len()).then_some(o);
            }
            Some(rng.below(v.len() - width + 1))
        };
        match rng.below(12) {
            0 => {
                if let Some(p) = pos(rng, &v, 1) {
                    v[p] ^= 1 << rng.below(8);
                }
            }
            1 => {
                if let Some(p) = pos(rng, &v, 1) {
                    v[p] = rng.next() as u8;
                }
            }
            2 => {
                if let Some(p) = pos(rng, &v, 1) {
                    v[p] = U8S[rng.below(U8S.len())];
                }
            }
            3 => {
                if let Some(p) = pos(rng, &v, 2) {
                    let x = U16S[rng.below(U16S.len())];
                    let b = if rng.chance(2) { x.to_le_bytes() } else { x.to_be_bytes() };
                    v[p..p + 2].copy_from_slice(&b);
                }
            }
            4 => {
                if let Some(p) = pos(rng, &v, 4) {
                    v[p..p + 4].copy_from_slice(&U32S[rng.below(U32S.len())].to_le_bytes());
                }
            }
            5 => {
                if let Some(p) = pos(rng, &v, 8) {
                    v[p..p + 8].copy_from_slice(&U64S[rng.below(U64S.len())].to_le_bytes());
                }
            }
            6 => {
                let p = rng.below(v.len() + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(p..p, bytes);
            }
            7 => {
                if !v.is_empty() {
                    let p = rng.below(v.len());
                    let most = if rng.chance(4) { 4096 } else { 16 };
                    let n = 1 + rng.below((v.len() - p).min(most));
                    v.drain(p..p + n);
                }
            }
            8 => {
                if !v.is_empty() {
                    let s = rng.below(v.len());
                    let n = 1 + rng.below((v.len() - s).min(256));
                    let piece = v[s..s + n].to_vec();
                    let p = rng.below(v.len() + 1);
                    if rng.chance(2) {
                        v.splice(p..p, piece);
                    } else {
                        let end = (p + n).min(v.len());
                        v.splice(p..end, piece);
                    }
                }
            }
            9 => {
                let other = &corpus[rng.below(corpus.len())].1;
                if !other.is_empty() {
                    let cut = rng.below(v.len() + 1);
                    let from = rng.below(other.len());
                    v.truncate(cut);
                    v.extend_from_slice(&other[from..]);
                }
            }
            10 if !shape.tokens.is_empty() => {
                let t = shape.tokens[rng.below(shape.tokens.len())].as_bytes();
                let p = rng.below(v.len() + 1);
                if rng.chance(2) || p == v.len() {
                    v.splice(p..p, t.iter().copied());
                } else {
                    let end = (p + t.len()).min(v.len());
                    v.splice(p..end, t.iter().copied());
                }
            }
            _ => {
                if let Some(p) = pos(rng, &v, 4) {
                    let x = u32::from_le_bytes(v[p..p + 4].try_into().expect("4 bytes"));
                    let d = 1 + rng.below(64) as u32;
                    let y = if rng.chance(2) { x.wrapping_add(d) } else { x.wrapping_sub(d) };
                    v[p..p + 4].copy_from_slice(&y.to_le_bytes());
                }
            }
        }
    }
    v.truncate(shape.max_len);
    v
}

/// The seeds of a target, sorted by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus").join(target);
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (every target has a seed corpus)", dir.display()))
        .map(|e| {
            let p = e.expect("a directory entry").path();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().expect("a name").to_string_lossy().into_owned(), bytes)
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{}: no seed", dir.display());
    seeds
}

/// Where the worker stands, for the watchdog.
struct Shared {
    /// The input running (its bytes, and where it came from).
    current: Mutex<(Vec<u8>, String)>,
    /// Nanoseconds after `t0` the running input started; 0 between inputs.
    started: AtomicU64,
    done: AtomicBool,
    runs: AtomicU64,
}

/// Saves a failing input; its path.
fn save(settings: &Settings, target: &str, input: &[u8]) -> PathBuf {
    std::fs::create_dir_all(&settings.out).unwrap_or_else(|e| panic!("{}: {e}", settings.out.display()));
    let path = settings.out.join(format!("{target}-{}", drivelet::fuzz::seed_name(input)));
    std::fs::write(&path, input).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

fn hex_head(input: &[u8]) -> String {
    let shown: String = input.iter().take(256).map(|b| format!("{b:02x}")).collect();
    if input.len() > 256 {
        format!("{shown}... ({} bytes)", input.len())
    } else {
        shown
    }
}

/// Runs one input; why it failed, if it did.
fn run_one(f: fn(&[u8]), input: &[u8], save_to: &std::ffi::CString) -> Option<String> {
    CURRENT.with(|c| c.set((input.as_ptr(), input.len(), save_to.as_ptr())));
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    BIGGEST.with(|b| b.set(0));
    ARMED.with(|a| a.set(true));
    let outcome = std::panic::catch_unwind(|| f(input));
    ARMED.with(|a| a.set(false));
    CURRENT.with(|c| c.set((std::ptr::null(), 0, std::ptr::null())));
    let (peak, biggest) = (PEAK.with(Cell::get), BIGGEST.with(Cell::get));
    match outcome {
        Err(e) => {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Some(format!("panicked: {msg}"))
        }
        Ok(()) if biggest > MAX_ALLOCATION => Some(format!("allocated {biggest} bytes at once (the bound is {MAX_ALLOCATION})")),
        Ok(()) if peak > MAX_LIVE => Some(format!("held {peak} bytes at once (the bound is {MAX_LIVE})")),
        Ok(()) => None,
    }
}

/// Fuzzes `target` for the configured time; panics naming the input that failed.
fn fuzz(target: &str) {
    let f = drivelet::fuzz::TARGETS.iter().find(|(n, _)| *n == target).unwrap_or_else(|| panic!("no target {target}")).1;
    let settings = Arc::new(Settings::from_env());
    let seeds = match &settings.replay {
        Some(p) if p.is_dir() => std::fs::read_dir(p).expect("the replay dir").map(|e| e.expect("entry").path()).map(|p| (p.display().to_string(), std::fs::read(&p).expect("a replay file"))).collect(),
        Some(p) => vec![(p.display().to_string(), std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))],
        None => corpus(target),
    };
    let replay = settings.replay.is_some();
    let shared = Arc::new(Shared { current: Mutex::new((Vec::new(), String::new())), started: AtomicU64::new(0), done: AtomicBool::new(false), runs: AtomicU64::new(0) });
    let t0 = Instant::now();
    let name = target.to_string();
    let worker = {
        let (shared, settings) = (shared.clone(), settings.clone());
        std::thread::Builder::new()
            .name(format!("fuzz-{target}"))
            .stack_size(8 << 20)
            .spawn(move || -> Result<(), String> {
                let shape = shape(&name);
                let mut rng = Rng(settings.seed ^ fnv(&name));
                let save_to = std::ffi::CString::new(settings.out.join(format!("{name}-refused-allocation")).as_os_str().as_encoded_bytes()).expect("no NUL");
                let _ = std::fs::create_dir_all(&settings.out);
                let deadline = Duration::from_secs_f64(settings.secs);
                let mut pool: Vec<Vec<u8>> = Vec::new();
                let mut i = 0usize;
                let result = loop {
                    let (input, from) = if i < seeds.len() {
                        (seeds[i].1.clone(), format!("seed {}", seeds[i].0))
                    } else if replay || t0.elapsed() >= deadline {
                        break Ok(());
                    } else {
                        let base = if !pool.is_empty() && rng.chance(3) { pool[rng.below(pool.len())].clone() } else { seeds[rng.below(seeds.len())].1.clone() };
                        let m = mutate(&mut rng, &base, &seeds, &shape);
                        (m, format!("mutant {} of seed {}", i - seeds.len(), settings.seed))
                    };
                    *shared.current.lock().expect("not poisoned") = (input.clone(), from.clone());
                    shared.started.store(t0.elapsed().as_nanos().max(1) as u64, Ordering::SeqCst);
                    let one = Instant::now();
                    let failed = run_one(f, &input, &save_to);
                    if replay || i < seeds.len() && settings.secs == 0.0 {
                        eprintln!("  {from}: {:.1?}", one.elapsed());
                    }
                    shared.started.store(0, Ordering::SeqCst);
                    shared.runs.fetch_add(1, Ordering::Relaxed);
                    if let Some(why) = failed {
                        let path = save(&settings, &name, &input);
                        break Err(format!("{why}\n  input: {from}, saved as {} (run it again: DRIVELET_FUZZ_REPLAY={} cargo test --features failpoints --test fuzz {name})\n  bytes: {}", path.display(), path.display(), hex_head(&input)));
                    }
                    if i >= seeds.len() {
                        if pool.len() < 64 {
                            pool.push(input);
                        } else {
                            let k = rng.below(64);
                            pool[k] = input;
                        }
                    }
                    i += 1;
                };
                drivelet::fuzz::remove_scratch();
                shared.done.store(true, Ordering::SeqCst);
                result
            })
            .expect("spawn the fuzz worker")
    };
    // The watchdog: an input running longer than the hang bound fails the target.
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if shared.done.load(Ordering::SeqCst) || worker.is_finished() {
            break;
        }
        let started = shared.started.load(Ordering::SeqCst);
        if started != 0 {
            let running = t0.elapsed().saturating_sub(Duration::from_nanos(started));
            if running > settings.hang {
                let (input, from) = shared.current.lock().map(|c| c.clone()).unwrap_or_default();
                if shared.started.load(Ordering::SeqCst) == started {
                    let path = save(&settings, target, &input);
                    panic!(
                        "fuzz target {target}: one input ran for more than {:?} (a hang)\n  input: {from}, saved as {}\n  bytes: {}",
                        settings.hang,
                        path.display(),
                        hex_head(&input)
                    );
                }
            }
        }
    }
    let result = worker.join().unwrap_or_else(|_| Err("the worker itself panicked".into()));
    let runs = shared.runs.load(Ordering::Relaxed);
    eprintln!("fuzz target {target}: {runs} inputs ({} seeds) in {:.1?}, seed {}", seeds_len(target, replay), t0.elapsed(), settings.seed);
    if let Err(why) = result {
        panic!("fuzz target {target}: {why}");
    }
    assert!(runs > 0, "fuzz target {target} ran no input");
}

fn seeds_len(target: &str, replay: bool) -> usize {
    if replay {
        0
    } else {
        corpus(target).len()
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                fuzz(stringify!($name));
            }
        )*

        #[test]
        fn every_target_of_the_library_has_a_test() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in drivelet::fuzz::TARGETS {
                assert!(tested.contains(name), "target {name} has no test in tests/fuzz/main.rs");
            }
        }
    };
}

targets!(gpt, mbr, note, journal, snapshot_note, key_header, mountinfo, udev, smartctl, blkid, dumpe2fs, config, admin_request, migration_pv, store_record, freeze_record);
