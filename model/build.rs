//! Link settings for binaries, tests and benches that use libtorch.
//!
//! `torch-sys` links `libtorch_cuda` only when a symbol pulls it in, so with the default
//! `--as-needed` a CUDA build of libtorch looks CPU-only at run time. For this package's own
//! tests and benches we force the library in (only when it exists) and add an rpath to the
//! torch `lib/` directory so nothing needs `LD_LIBRARY_PATH`. The directory is re-exported as
//! `DEP_SPECD_MODEL_TORCH_TORCH_LIB` so that binaries depending on this crate (the `specd`
//! binary's build script) can emit the same flags: `cargo:rustc-link-arg` applies only to the
//! targets of the package whose build script prints it.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib_dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:torch_lib={lib_dir}");
    let dir = Path::new(&lib_dir);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    if dir.join("libtorch_cuda.so").exists() {
        println!("cargo:torch_cuda=1");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{lib_dir}");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
