//! Generates the CSI, kubelet plugin-registration gRPC code from `proto/`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_protos(
            &["proto/csi.proto", "proto/pluginregistration.proto"],
            &["proto"],
        )?;
    Ok(())
}
