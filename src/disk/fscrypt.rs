//! The kernel's filesystem encryption (fscrypt, policy v2) on an ext4 volume: the key
//! added to and removed from a mounted filesystem, the encrypted directory the pod
//! sees made and checked. Only ioctls on descriptors: nothing here looks a path up.
//!
//! Rules:
//! - a policy is v2 only (its key identifier is derived by the kernel from the key, so
//!   a wrong key can never open a directory by accident), AES-256-XTS for contents and
//!   AES-256-CTS for names, names padded to 32 bytes (the kernel's recommended set);
//! - the directory the pod sees ([`DATA_DIR`]) is made empty and given the policy at
//!   once; a directory already there must carry exactly the volume's policy, and an
//!   existing directory without one is refused unless empty (a stage cut short between
//!   the two steps): plaintext is never served as if it were encrypted;
//! - the key is the caller's to keep secret: it is passed in a buffer zeroed after the
//!   call and never shown.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use super::DiskError;

/// The directory, in the volume's filesystem, that holds the tenant's files encrypted
/// and is what the pod's target shows.
pub const DATA_DIR: &str = "data";

/// Where the kernel says ext4 can encrypt.
pub const EXT4_FEATURE: &str = "/sys/fs/ext4/features/encryption";

/// Length of a volume's master key (what the kernel recommends for v2 policies).
pub const KEY_LEN: usize = 64;

const FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER: u32 = 2;
const FSCRYPT_POLICY_V2: u8 = 2;
const FSCRYPT_MODE_AES_256_XTS: u8 = 1;
const FSCRYPT_MODE_AES_256_CTS: u8 = 4;
const FSCRYPT_POLICY_FLAGS_PAD_32: u8 = 0x03;

/// `struct fscrypt_key_specifier`.
#[repr(C)]
#[derive(Clone, Copy)]
struct KeySpec {
    kind: u32,
    reserved: u32,
    u: [u8; 32],
}

/// `struct fscrypt_add_key_arg` with its raw key after it.
#[repr(C)]
struct AddKey {
    spec: KeySpec,
    raw_size: u32,
    key_id: u32,
    reserved: [u32; 8],
    raw: [u8; KEY_LEN],
}

/// `struct fscrypt_remove_key_arg`.
#[repr(C)]
struct RemoveKey {
    spec: KeySpec,
    status_flags: u32,
    reserved: [u32; 5],
}

/// `struct fscrypt_policy_v2`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct PolicyV2 {
    version: u8,
    contents: u8,
    filenames: u8,
    flags: u8,
    log2_data_unit_size: u8,
    reserved: [u8; 3],
    identifier: [u8; 16],
}

/// `struct fscrypt_get_policy_ex_arg` (the v2 policy is the largest member).
#[repr(C)]
struct GetPolicyEx {
    size: u64,
    policy: PolicyV2,
}

// FS_IOC_ADD_ENCRYPTION_KEY: _IOWR('f', 23, struct fscrypt_add_key_arg); the size in the
// number is that of the struct without the flexible raw key.
nix::ioctl_readwrite_bad!(
    /// FS_IOC_ADD_ENCRYPTION_KEY.
    ioc_add_key, nix::request_code_readwrite!(b'f', 23, 80), AddKey);
nix::ioctl_readwrite!(
    /// FS_IOC_REMOVE_ENCRYPTION_KEY.
    ioc_remove_key, b'f', 24, RemoveKey);
// FS_IOC_SET_ENCRYPTION_POLICY: _IOR('f', 19, struct fscrypt_policy_v1), whatever the
// version passed.
nix::ioctl_read_bad!(
    /// FS_IOC_SET_ENCRYPTION_POLICY.
    ioc_set_policy, nix::request_code_read!(b'f', 19, 12), PolicyV2);
// FS_IOC_GET_ENCRYPTION_POLICY_EX: _IOWR('f', 22, __u8[9]).
nix::ioctl_readwrite_bad!(
    /// FS_IOC_GET_ENCRYPTION_POLICY_EX.
    ioc_get_policy_ex, nix::request_code_readwrite!(b'f', 22, 9), GetPolicyEx);

/// Whether this kernel's ext4 can encrypt.
pub fn supported() -> bool {
    std::path::Path::new(EXT4_FEATURE).exists()
}

fn io(what: &str, e: nix::Error) -> DiskError {
    DiskError::Io { what: what.to_string(), source: std::io::Error::from(e) }
}

/// Adds `key` to the filesystem `root` (a descriptor of any directory of it, normally
/// its root) and returns the key's identifier, as the kernel derives it.
pub fn add_key(root: &File, key: &[u8; KEY_LEN]) -> Result<[u8; 16], DiskError> {
    let mut arg = AddKey {
        spec: KeySpec { kind: FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER, reserved: 0, u: [0; 32] },
        raw_size: KEY_LEN as u32,
        key_id: 0,
        reserved: [0; 8],
        raw: *key,
    };
    // SAFETY: `arg` is a live, properly laid out `fscrypt_add_key_arg` followed by
    // `raw_size` bytes of key, as the ioctl reads; the descriptor is open.
    let r = unsafe { ioc_add_key(root.as_raw_fd(), &mut arg) };
    arg.raw.fill(0);
    // The compiler may not drop the wipe of a buffer read after it.
    std::hint::black_box(&arg.raw);
    r.map_err(|e| io("add the volume's key to its filesystem", e))?;
    let mut id = [0u8; 16];
    id.copy_from_slice(&arg.spec.u[..16]);
    Ok(id)
}

/// Removes the key `identifier` from the filesystem `root`: its files can no longer be
/// read in plaintext. `Ok(true)` when some of its files were still in use (they lose
/// their plaintext when closed); a key not there is `Ok(false)` too.
pub fn remove_key(root: &File, identifier: &[u8; 16]) -> Result<bool, DiskError> {
    let mut u = [0u8; 32];
    u[..16].copy_from_slice(identifier);
    let mut arg = RemoveKey { spec: KeySpec { kind: FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER, reserved: 0, u }, status_flags: 0, reserved: [0; 5] };
    // SAFETY: `arg` is a properly laid out `fscrypt_remove_key_arg`; the fd is open.
    match unsafe { ioc_remove_key(root.as_raw_fd(), &mut arg) } {
        Ok(_) => Ok(arg.status_flags & 0x1 != 0),
        Err(nix::Error::ENOKEY) => Ok(false),
        Err(e) => Err(io("remove the volume's key from its filesystem", e)),
    }
}

fn policy(identifier: &[u8; 16]) -> PolicyV2 {
    PolicyV2 {
        version: FSCRYPT_POLICY_V2,
        contents: FSCRYPT_MODE_AES_256_XTS,
        filenames: FSCRYPT_MODE_AES_256_CTS,
        flags: FSCRYPT_POLICY_FLAGS_PAD_32,
        log2_data_unit_size: 0,
        reserved: [0; 3],
        identifier: *identifier,
    }
}

/// The encryption policy of the directory `dir`: `None` when it has none.
fn policy_of(dir: &File) -> Result<Option<PolicyV2>, DiskError> {
    let mut arg = GetPolicyEx { size: std::mem::size_of::<PolicyV2>() as u64, policy: policy(&[0; 16]) };
    // SAFETY: `arg` is a properly laid out `fscrypt_get_policy_ex_arg` with room for a v2
    // policy; the fd is open.
    match unsafe { ioc_get_policy_ex(dir.as_raw_fd(), &mut arg) } {
        Ok(_) => Ok(Some(arg.policy)),
        Err(nix::Error::ENODATA) => Ok(None),
        Err(e) => Err(io("read the encryption policy of the volume's data directory", e)),
    }
}

/// Opens `name` beneath the directory `at` without following a link.
fn open_dir_at(at: &File, name: &str) -> Result<Option<File>, DiskError> {
    let c = CString::new(name).map_err(|_| DiskError::invalid(format!("{name:?} is no directory name")))?;
    // SAFETY: `c` is a NUL-terminated string; the returned descriptor is owned below.
    let fd = unsafe { libc::openat(at.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(DiskError::Io { what: format!("the volume's {name} directory"), source: e }),
        };
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(Some(unsafe { File::from_raw_fd(fd) }))
}

fn is_empty(dir: &File) -> Result<bool, DiskError> {
    // The directory's own descriptor, read through /proc/self/fd: no lookup of a path
    // that could have changed.
    let listed = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| DiskError::Io { what: "the volume's data directory".into(), source: e })?;
    Ok(listed.take(1).count() == 0)
}

/// Makes sure the filesystem whose root is `root` holds [`DATA_DIR`] encrypted under
/// the key `identifier` (already added), making it when absent; returns it opened.
pub fn ensure_data_dir(root: &File, identifier: &[u8; 16]) -> Result<File, DiskError> {
    let want = policy(identifier);
    let dir = match open_dir_at(root, DATA_DIR)? {
        Some(d) => d,
        None => {
            match nix::sys::stat::mkdirat(root, DATA_DIR, nix::sys::stat::Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(io("make the volume's data directory", e)),
            }
            open_dir_at(root, DATA_DIR)?.ok_or_else(|| DiskError::invalid("the volume's data directory vanished as it was made"))?
        }
    };
    match policy_of(&dir)? {
        Some(p) if p == want => Ok(dir),
        Some(p) if p.identifier != *identifier => Err(DiskError::invalid(
            "the volume's data directory is encrypted with another key than the one its partition holds",
        )),
        Some(_) => Err(DiskError::invalid("the volume's data directory is encrypted with settings drivelet does not make")),
        None if is_empty(&dir)? => {
            let mut p = want;
            // SAFETY: `p` is a properly laid out `fscrypt_policy_v2`; the fd is open.
            unsafe { ioc_set_policy(dir.as_raw_fd(), &mut p) }.map_err(|e| io("encrypt the volume's data directory", e))?;
            Ok(dir)
        }
        None => Err(DiskError::invalid("the volume's data directory holds files that are not encrypted: drivelet does not serve them")),
    }
}

/// The key identifier the data directory of the filesystem `root` is encrypted under,
/// if it has one.
pub fn data_dir_key(root: &File) -> Result<Option<[u8; 16]>, DiskError> {
    let Some(dir) = open_dir_at(root, DATA_DIR)? else { return Ok(None) };
    Ok(policy_of(&dir)?.map(|p| p.identifier))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<KeySpec>(), 40);
        assert_eq!(std::mem::size_of::<AddKey>(), 80 + KEY_LEN);
        assert_eq!(std::mem::size_of::<RemoveKey>(), 64);
        assert_eq!(std::mem::size_of::<PolicyV2>(), 24);
        assert_eq!(std::mem::size_of::<GetPolicyEx>(), 32);
        // The request numbers the kernel's headers give.
        assert_eq!(nix::request_code_readwrite!(b'f', 23, 80) as u64, 0xc050_6617);
        assert_eq!(nix::request_code_readwrite!(b'f', 24, std::mem::size_of::<RemoveKey>()) as u64, 0xc040_6618);
        assert_eq!(nix::request_code_read!(b'f', 19, 12) as u64, 0x800c_6613);
        assert_eq!(nix::request_code_readwrite!(b'f', 22, 9) as u64, 0xc009_6616);
    }
}
