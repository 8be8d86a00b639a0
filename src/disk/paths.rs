//! Staging and target paths handed in by the CO, checked before anything is created or
//! mounted there.
//!
//! Rules: a path must be absolute, at most 4096 bytes, free of NUL, `.` and `..`
//! components, and lie under one of the allowed roots once every symlink in its
//! existing part is resolved; the final component itself may not be a symlink. So
//! `/var/lib/kubelet/../../etc` and a symlink planted to point at `/etc` are refused
//! alike.

use std::path::{Component, Path, PathBuf};

/// Checks `path` against `roots` and returns it unchanged when it is acceptable; the
/// error says what is wrong in words.
pub(crate) fn check_under_roots(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, String> {
    let shown = path.display();
    let raw = path.as_os_str().as_encoded_bytes();
    if raw.is_empty() {
        return Err("path is empty".into());
    }
    if raw.len() > 4096 {
        return Err(format!("path is {} bytes long; the limit is 4096", raw.len()));
    }
    if raw.contains(&0) {
        return Err("path contains a NUL byte".into());
    }
    if !path.is_absolute() {
        return Err(format!("path {shown} is not absolute"));
    }
    // `Path::components` silently drops inner `.`; look at the raw segments.
    if raw.split(|b| *b == b'/').any(|seg| seg == b"." || seg == b"..")
        || path.components().any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!("path {shown} contains '.' or '..' components"));
    }
    if std::fs::symlink_metadata(path).map(|m| m.file_type().is_symlink()).unwrap_or(false) {
        return Err(format!("path {shown} is a symbolic link"));
    }
    // Resolve the deepest existing ancestor; the rest does not exist yet and so cannot
    // contain a symlink.
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    let resolved = loop {
        match std::fs::canonicalize(&existing) {
            Ok(p) => break p,
            Err(_) => {
                let Some(name) = existing.file_name().map(|n| n.to_os_string()) else {
                    return Err(format!("no part of {shown} exists"));
                };
                rest.push(name);
                if !existing.pop() {
                    return Err(format!("no part of {shown} exists"));
                }
            }
        }
    };
    let full = rest.iter().rev().fold(resolved, |p, n| p.join(n));
    for root in roots {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
        if full.starts_with(&root) && full != root {
            return Ok(path.to_path_buf());
        }
    }
    let allowed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(format!(
        "path {shown} resolves to {} which is outside the allowed roots ({}); see volumes.allowed_roots",
        full.display(),
        allowed.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_roots_or_escaping_them_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        std::fs::create_dir_all(root.join("pods/p1")).unwrap();
        std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("pods/evil")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("evil-parent")).unwrap();
        let roots = vec![root.clone()];
        assert!(check_under_roots(&root.join("pods/p1/mount"), &roots).is_ok());
        assert!(check_under_roots(&root.join("pods/new/deeper/mount"), &roots).is_ok());
        let bad = [
            PathBuf::from("relative/path"),
            PathBuf::new(),
            root.join("pods/../../elsewhere"),
            root.join("pods/./p1"),
            root.join("pods/evil"),
            root.join("evil-parent/target"),
            dir.path().join("elsewhere/x"),
            root.clone(),
            PathBuf::from("/etc/passwd"),
        ];
        for b in bad {
            assert!(check_under_roots(&b, &roots).is_err(), "{} must be refused", b.display());
        }
        let long = root.join("a".repeat(5000));
        assert!(check_under_roots(&long, &roots).unwrap_err().contains("4096"));
        use std::os::unix::ffi::OsStrExt;
        let nul = PathBuf::from(std::ffi::OsStr::from_bytes(b"/var/lib/kubelet/a\0b"));
        assert!(check_under_roots(&nul, &roots).unwrap_err().contains("NUL"));
    }
}
