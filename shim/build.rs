// Compiles proto/shim/v1/shim.proto (messages only: the transport is our own framing over a unix
// socket, see the proto's header). protoc comes from protoc-bin-vendored like the root crate's.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=../proto/shim");
    prost_build::Config::new().compile_protos(&["../proto/shim/v1/shim.proto"], &["../proto"])?;
    // Relative relocations packed (DT_RELR, glibc 2.36+), as the daemon's (../build.rs): each
    // pod's shim reads 0.5 MB of RELA entries at its start otherwise.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    Ok(())
}
