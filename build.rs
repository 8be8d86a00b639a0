//! Generates the CSI, kubelet plugin-registration gRPC code from `proto/`.
//!
//! Every CSI message with a `secrets` field gets no derived `Debug`: its `Debug` is
//! written here (`csi_secrets_debug.rs`), naming every field but showing the secrets only
//! as a count, so a request's secrets cannot reach a log line or an error through
//! `{:?}`. The impl destructures the whole struct: a field added to the proto and not
//! printed would not compile.

use std::fmt::Write as _;

/// Top-level messages of `proto` that have a field named `secrets`.
fn messages_with_secrets(proto: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut current: Option<String> = None;
    for line in proto.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if depth == 0 {
            if let Some(rest) = code.strip_prefix("message ") {
                current = rest.split_whitespace().next().map(str::to_string);
            }
        }
        if depth == 1 && code.split_whitespace().nth(2).is_some_and(|w| w == "secrets") {
            if let Some(m) = &current {
                if !out.contains(m) {
                    out.push(m.clone());
                }
            }
        }
        depth += code.matches('{').count();
        depth = depth.saturating_sub(code.matches('}').count());
    }
    out
}

/// The field names of the top-level `pub struct name` in generated code.
fn fields_of(generated: &str, name: &str) -> Vec<String> {
    let start = format!("pub struct {name} {{");
    let mut fields = Vec::new();
    let mut inside = false;
    for line in generated.lines() {
        if !inside {
            inside = line == start;
            continue;
        }
        if line == "}" {
            break;
        }
        if let Some(rest) = line.strip_prefix("    pub ") {
            if let Some((field, _)) = rest.split_once(':') {
                fields.push(field.trim().to_string());
            }
        }
    }
    fields
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    let proto = std::fs::read_to_string("proto/csi.proto")?;
    let secret = messages_with_secrets(&proto);
    if secret.is_empty() {
        return Err("proto/csi.proto: no message with a secrets field found; the reader of build.rs is wrong".into());
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .skip_debug(secret.iter().map(|m| format!(".csi.v1.{m}")))
        .compile_protos(&["proto/csi.proto", "proto/pluginregistration.proto"], &["proto"])?;

    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let generated = std::fs::read_to_string(out.join("csi.v1.rs"))?;
    let mut code = String::from("// Written by build.rs: Debug of the CSI messages that carry secrets.\n");
    for m in &secret {
        let fields = fields_of(&generated, m);
        if !fields.contains(&"secrets".to_string()) {
            return Err(format!("generated struct {m} has no secrets field: {fields:?}").into());
        }
        let bind = fields.join(", ");
        writeln!(code, "impl ::core::fmt::Debug for {m} {{")?;
        writeln!(code, "    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{")?;
        writeln!(code, "        let {m} {{ {bind} }} = self;")?;
        write!(code, "        f.debug_struct(\"{m}\")")?;
        for field in &fields {
            let shown = field.trim_start_matches("r#");
            if field == "secrets" {
                write!(code, ".field(\"secrets\", &crate::grpc::Redacted(secrets.len()))")?;
            } else {
                write!(code, ".field(\"{shown}\", {field})")?;
            }
        }
        writeln!(code, ".finish()\n    }}\n}}")?;
    }
    std::fs::write(out.join("csi_secrets_debug.rs"), code)?;
    Ok(())
}
