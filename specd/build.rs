//! Link settings for the `specd` binary and this package's tests: an rpath to torch's `lib/`
//! (so they run without `LD_LIBRARY_PATH`) and, when the libtorch in use has CUDA,
//! `libtorch_cuda` linked with `--no-as-needed` (tch references no symbol of it, so it would
//! be dropped and CUDA would look absent). The directory comes from `specd-model`'s build
//! script (`links = "specd_model_torch"`).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SPECD_MODEL_TORCH_TORCH_LIB");
    let Ok(lib_dir) = std::env::var("DEP_SPECD_MODEL_TORCH_TORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    if std::env::var_os("DEP_SPECD_MODEL_TORCH_TORCH_CUDA").is_some() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{lib_dir}");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
