//! The names of this node's `Drive` objects and the value of their node label (see the
//! naming rules in the module doc of `k8s::drives`).


const MAX_NAME: usize = 253;
const MAX_LABEL_VALUE: usize = 63;

/// FNV-1a over the node name and drive id, NUL-separated so the split is part of it.
fn name_hash(parts: &[&str]) -> String {
    let mut hash = 0x811c_9dc5_u32;
    for (i, part) in parts.iter().enumerate() {
        let sep: &[u8] = if i == 0 { &[] } else { &[0] };
        for b in sep.iter().chain(part.as_bytes()) {
            hash = (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193);
        }
    }
    format!("{hash:08x}")
}

/// `s` as a DNS-1123 subdomain: lowercase ASCII letters and digits kept, `.` kept between
/// labels, anything else `-`; labels trimmed of `-` at both ends, empty labels dropped.
fn dns_subdomain(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' { c } else { '-' })
        .collect();
    mapped.split('.').map(|label| label.trim_matches('-')).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(".")
}

/// The name of the `Drive` object for `drive_id` on `node` (see the module rules): a valid
/// DNS-1123 subdomain of at most 253 characters, the same on every call, different for
/// every node and drive.
pub(crate) fn object_name(node: &str, drive_id: &str) -> String {
    let hash = name_hash(&[node, drive_id]);
    let mut base = dns_subdomain(&format!("{node}-{drive_id}"));
    // Every character of `base` is ASCII, so cutting at a byte count is cutting at a char.
    base.truncate(MAX_NAME - 1 - hash.len());
    let base = base.trim_end_matches(['-', '.']);
    if base.is_empty() {
        hash
    } else {
        format!("{base}-{hash}")
    }
}

/// Whether `v` is a valid label value: at most 63 characters, ASCII letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit (or empty).
fn is_label_value(v: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    v.len() <= MAX_LABEL_VALUE
        && v.chars().all(ok_char)
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

/// The value of [`NODE_LABEL`] for `node`: the node name itself when it is a valid label
/// value (Kubernetes node names up to 63 characters are), otherwise a sanitized prefix
/// of it with a hash of the whole name appended.
pub(crate) fn node_label_value(node: &str) -> String {
    if is_label_value(node) {
        return node.to_string();
    }
    let hash = name_hash(&[node]);
    let mut base: String =
        node.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    base.truncate(MAX_LABEL_VALUE - 1 - hash.len());
    let base = base.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if base.is_empty() {
        hash
    } else {
        format!("{base}-{hash}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;


    /// Kubernetes' own check (IsDNS1123Subdomain): at most 253 characters, dot-separated
    /// labels of lowercase letters, digits and `-` that start and end with a letter or digit.
    fn is_dns_subdomain(s: &str) -> bool {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        !s.is_empty() && s.len() <= 253 && s.split('.').all(label_ok)
    }

    #[test]
    fn object_names_are_stable_dns_subdomains_with_a_hash_of_node_and_drive() {
        let long_node = "n".repeat(200);
        let long_id = format!("wwn-{}", "A".repeat(100));
        let long_prefix = format!("{long_node}-wwn-aaaa");
        // (node, drive id, the name, or when `cut`, what the name starts with)
        let table: Vec<(&str, &str, &str, bool)> = vec![
            ("node-a", "wwn-0x5000c500a1b2c3d4", "node-a-wwn-0x5000c500a1b2c3d4-6e07307b", false),
            ("Node_A", "ata-Samsung_SSD_870_S5Y1NX0R", "node-a-ata-samsung-ssd-870-s5y1nx0r-41bb2af8", false),
            ("node-a", "loop-d1.img-1a2b3c4d", "node-a-loop-d1.img-1a2b3c4d-bfa81c97", false),
            ("-", ".", "c23b4572", false),
            (&long_node, &long_id, &long_prefix, true),
        ];
        for (node, id, want, cut) in table {
            let name = object_name(node, id);
            assert!(is_dns_subdomain(&name), "{name:?} is not a DNS-1123 subdomain");
            assert_eq!(name, object_name(node, id), "the same on every call");
            if cut {
                assert!(name.starts_with(want), "{name}");
                assert_eq!(name.len(), 253);
                assert_ne!(name, object_name(node, &format!("{id}B")), "cut alike, still apart");
            } else {
                assert_eq!(name, want, "{node} {id}");
            }
        }
        assert_ne!(object_name("a-b", "c"), object_name("a", "b-c"), "the split between node and drive counts");
        assert_ne!(object_name("node-a", "ata-X_1"), object_name("node-a", "ata-x-1"), "sanitized alike, still apart");
        assert_ne!(object_name("node-a", "d1"), object_name("node-b", "d1"));
        assert!(is_dns_subdomain(&object_name("node.example.com", "loop-.img.-")), "no empty or dashed labels");
    }

    #[test]
    fn node_label_is_the_node_name_unless_it_is_no_valid_label_value() {
        let long = "n".repeat(70);
        let table = [
            ("node-a", "node-a"),
            ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1.ec2.internal"),
            ("Worker_1", "Worker_1"),
            ("Worker 1/A", "Worker-1-A-c49e3a08"),
            (long.as_str(), "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn-3395645d"),
        ];
        for (node, want) in table {
            let value = node_label_value(node);
            assert_eq!(value, want, "{node}");
            assert!(is_label_value(&value), "{value}");
        }
    }
}
