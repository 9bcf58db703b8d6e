// Compiles proto/runtime/v1/api.proto (CRI v1) into tonic server and client code.
// protoc comes from protoc-bin-vendored so a fresh machine needs no system protobuf package.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/runtime/v1/api.proto"], &["proto"])?;
    Ok(())
}
