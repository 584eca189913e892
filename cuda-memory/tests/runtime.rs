//! What can be checked without a GPU: the runtime opens or says why not, a library without
//! the runtime's functions is refused by name, and a device the runtime does not see is an
//! error, not a panic. With a GPU the same tests check the numbers it reports.

use specd_cuda_memory::{CudaMemoryError, CudaRuntime, SONAMES, device_memory};

/// The pip wheel's runtime, found from libtorch's directory on LD_LIBRARY_PATH the way
/// libtorch's own RPATH finds it (`torch/lib/../../nvidia/cu13/lib`); `None` without one.
fn wheel_runtime() -> Option<String> {
    let paths = std::env::var("LD_LIBRARY_PATH").ok()?;
    paths
        .split(':')
        .map(|dir| format!("{dir}/../../nvidia/cu13/lib/libcudart.so.13"))
        .find(|p| std::path::Path::new(p).is_file())
}

/// A device's numbers when the runtime sees it; otherwise the typed error.
fn check_device_zero(result: Result<specd_cuda_memory::DeviceMemory, CudaMemoryError>) {
    eprintln!("cuda:0: {result:?}");
    match result {
        Ok(memory) => assert!(memory.total_bytes > 0 && memory.free_bytes <= memory.total_bytes, "{memory:?}"),
        Err(CudaMemoryError::NoDevice { index: 0, reason }) => assert!(!reason.is_empty()),
        Err(other) => panic!("cuda:0 gave neither its memory nor NoDevice: {other}"),
    }
}

#[test]
fn the_runtime_opens_or_names_every_soname_it_tried() {
    match CudaRuntime::open() {
        Ok(runtime) => assert!(SONAMES.contains(&runtime.name()), "{}", runtime.name()),
        Err(CudaMemoryError::RuntimeMissing { tried }) => {
            for name in SONAMES {
                assert!(tried.contains(name), "{name} is not named in {tried}");
            }
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn the_wheels_runtime_answers_for_device_zero_or_says_it_sees_none() {
    let Some(path) = wheel_runtime() else {
        eprintln!("skipped: no torch/lib with the pip wheel's libcudart.so.13 on LD_LIBRARY_PATH");
        return;
    };
    let runtime = CudaRuntime::open_path(&path).unwrap();
    check_device_zero(runtime.device_memory(0));
    // Past every device there is: the same typed error, also for an index no C int holds.
    for index in [4096, usize::MAX] {
        let err = runtime.device_memory(index).unwrap_err();
        assert!(matches!(err, CudaMemoryError::NoDevice { index: i, .. } if i == index), "{err}");
        assert!(err.to_string().contains(&format!("cuda:{index}")), "{err}");
    }
}

#[test]
fn the_process_wide_query_returns_a_typed_error_without_a_runtime_or_a_device() {
    match device_memory(0) {
        Err(CudaMemoryError::RuntimeMissing { .. }) => {}
        other => check_device_zero(other),
    }
}

#[test]
fn a_missing_file_and_a_library_that_is_not_the_runtime_are_told_apart() {
    let err = CudaRuntime::open_path("/nonexistent/libcudart.so.13").unwrap_err();
    assert!(matches!(&err, CudaMemoryError::RuntimeMissing { tried } if tried.contains("/nonexistent")), "{err}");
    let err = CudaRuntime::open_path("libc.so.6").unwrap_err();
    assert!(matches!(&err, CudaMemoryError::MissingFunction { function: "cudaGetDeviceCount", .. }), "{err}");
}
