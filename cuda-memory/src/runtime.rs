//! The CUDA runtime opened at run time, and the calls made to it. The only module of the
//! workspace with `unsafe` code: each block calls a C function of the runtime, and says why
//! the call is sound.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int};

use libloading::Library;

use crate::error::CudaMemoryError;
use crate::memory::DeviceMemory;

/// The sonames tried, newest first: the runtime a libtorch CUDA build links (13: the pip
/// torch 2.11 cu130 wheel, which ships it under site-packages/nvidia/cu13/lib; 12 and 11.0:
/// cu12x and cu11x builds), then the bare name a CUDA toolkit installs.
pub const SONAMES: [&str; 4] = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"];

/// `cudaSuccess`.
const SUCCESS: c_int = 0;
/// `cudaErrorInsufficientDriver`: no driver, or one older than the runtime.
const INSUFFICIENT_DRIVER: c_int = 35;
/// `cudaErrorNoDevice`.
const NO_DEVICE: c_int = 100;

/// `dlopen`'s flag to return a library only if the process has loaded it already (glibc's
/// and musl's value; libloading does not name it).
#[cfg(target_os = "linux")]
const RTLD_NOLOAD: c_int = 0x4;

type IntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type IntIn = unsafe extern "C" fn(c_int) -> c_int;
type NoArgs = unsafe extern "C" fn() -> c_int;
type MemInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// An opened CUDA runtime and the functions this crate calls.
#[derive(Debug)]
pub struct CudaRuntime {
    name: String,
    get_device_count: IntOut,
    get_device: IntOut,
    set_device: IntIn,
    mem_get_info: MemInfo,
    get_last_error: NoArgs,
    get_error_string: ErrorString,
    // Last, and never used: it keeps the library, and so the function pointers above,
    // loaded for as long as they can be called.
    _library: Library,
}

impl CudaRuntime {
    /// The runtime libtorch loaded, where one of [`SONAMES`] is loaded already (so device
    /// numbers, `CUDA_VISIBLE_DEVICES` and contexts are libtorch's); else the first of them
    /// the dynamic loader finds.
    pub fn open() -> Result<Self, CudaMemoryError> {
        for name in SONAMES {
            if let Some(library) = already_loaded(name) {
                return Self::from_library(name, library);
            }
        }
        let mut tried = Vec::new();
        for name in SONAMES {
            match Self::open_path(name) {
                Ok(runtime) => return Ok(runtime),
                Err(CudaMemoryError::RuntimeMissing { tried: why }) => tried.push(why),
                Err(other) => return Err(other),
            }
        }
        Err(CudaMemoryError::RuntimeMissing { tried: tried.join("; ") })
    }

    /// The runtime at `path` (a file, or a name the dynamic loader looks up).
    pub fn open_path(path: &str) -> Result<Self, CudaMemoryError> {
        // SAFETY: loading a library runs its initialisers. The CUDA runtime's only set up
        // its own state (it initialises the driver lazily, at the first call that needs it),
        // and opening a library the process has loaded already only counts one more
        // reference to it.
        let library = unsafe { Library::new(path) }
            .map_err(|e| CudaMemoryError::RuntimeMissing { tried: format!("{path}: {e}") })?;
        Self::from_library(path, library)
    }

    fn from_library(name: &str, library: Library) -> Result<Self, CudaMemoryError> {
        let missing = |function: &'static str| {
            move |e: libloading::Error| CudaMemoryError::MissingFunction {
                library: name.to_owned(),
                function,
                reason: e.to_string(),
            }
        };
        // SAFETY: each `get` names a function of the CUDA runtime API with its C signature
        // (`cudaError_t` is a C enum, an `int`; `size_t` is `usize`), the same in every
        // runtime from 11.0 to 13, and the pointers are kept only beside `library`.
        let runtime = unsafe {
            Self {
                get_device_count: *library
                    .get::<IntOut>(b"cudaGetDeviceCount\0")
                    .map_err(missing("cudaGetDeviceCount"))?,
                get_device: *library.get::<IntOut>(b"cudaGetDevice\0").map_err(missing("cudaGetDevice"))?,
                set_device: *library.get::<IntIn>(b"cudaSetDevice\0").map_err(missing("cudaSetDevice"))?,
                mem_get_info: *library.get::<MemInfo>(b"cudaMemGetInfo\0").map_err(missing("cudaMemGetInfo"))?,
                get_last_error: *library.get::<NoArgs>(b"cudaGetLastError\0").map_err(missing("cudaGetLastError"))?,
                get_error_string: *library
                    .get::<ErrorString>(b"cudaGetErrorString\0")
                    .map_err(missing("cudaGetErrorString"))?,
                name: name.to_owned(),
                _library: library,
            }
        };
        Ok(runtime)
    }

    /// The name or path it was opened by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Free and total bytes of device `index`; see [`crate::device_memory`] for which
    /// thread to call it on.
    pub fn device_memory(&self, index: usize) -> Result<DeviceMemory, CudaMemoryError> {
        let count = match self.int_out(self.get_device_count, "cudaGetDeviceCount") {
            Ok(count) => count,
            Err(CudaMemoryError::CallFailed { call, code: code @ (NO_DEVICE | INSUFFICIENT_DRIVER), message }) => {
                return Err(CudaMemoryError::NoDevice {
                    index,
                    reason: format!("{call}: {message} (CUDA error {code})"),
                });
            }
            Err(other) => return Err(other),
        };
        let wanted = c_int::try_from(index)
            .ok()
            .filter(|&i| i < count)
            .ok_or_else(|| CudaMemoryError::NoDevice { index, reason: format!("it sees {count} device(s)") })?;
        let current = self.int_out(self.get_device, "cudaGetDevice")?;
        if current == wanted {
            return self.mem_info();
        }
        self.call(self.set_device, wanted, "cudaSetDevice")?;
        let measured = self.mem_info();
        // The thread's own device again, whatever the query gave: libtorch's next call on
        // this thread must find it as it left it.
        let restored = self.call(self.set_device, current, "cudaSetDevice");
        let memory = measured?;
        restored?;
        Ok(memory)
    }

    fn mem_info(&self) -> Result<DeviceMemory, CudaMemoryError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both pointers are to live locals of the type cudaMemGetInfo writes.
        let code = unsafe { (self.mem_get_info)(&mut free, &mut total) };
        self.check(code, "cudaMemGetInfo")?;
        Ok(DeviceMemory { free_bytes: free as u64, total_bytes: total as u64 })
    }

    fn int_out(&self, function: IntOut, call: &'static str) -> Result<c_int, CudaMemoryError> {
        let mut value: c_int = 0;
        // SAFETY: `function` is cudaGetDeviceCount or cudaGetDevice, which write one int
        // through the pointer, here to a live local.
        let code = unsafe { function(&mut value) };
        self.check(code, call)?;
        Ok(value)
    }

    fn call(&self, function: IntIn, argument: c_int, call: &'static str) -> Result<(), CudaMemoryError> {
        // SAFETY: `function` is cudaSetDevice, which takes an int by value.
        let code = unsafe { function(argument) };
        self.check(code, call)
    }

    /// `code` as a result. A failed call also clears the thread's last CUDA error, which the
    /// runtime sets with it: libtorch checks that error after its own kernel launches and
    /// would take ours for one of theirs.
    fn check(&self, code: c_int, call: &'static str) -> Result<(), CudaMemoryError> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: cudaGetLastError takes nothing and only reads and resets the thread's
        // last error.
        unsafe { (self.get_last_error)() };
        Err(CudaMemoryError::CallFailed { call, code, message: self.describe(code) })
    }

    fn describe(&self, code: c_int) -> String {
        // SAFETY: cudaGetErrorString takes any code and returns null or a pointer to a
        // static NUL-terminated string ("unrecognized error code" for unknown ones).
        let text = unsafe { (self.get_error_string)(code) };
        if text.is_null() {
            return "no description".to_owned();
        }
        // SAFETY: not null, and static and NUL-terminated as above.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }
}

/// `name` if the process has loaded it already (`RTLD_NOLOAD`: nothing new is loaded).
#[cfg(target_os = "linux")]
fn already_loaded(name: &str) -> Option<Library> {
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: with RTLD_NOLOAD nothing is loaded, so no initialiser runs; an already loaded
    // library only gets one more reference.
    let library = unsafe { UnixLibrary::open(Some(name), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) };
    library.ok().map(Library::from)
}

#[cfg(not(target_os = "linux"))]
fn already_loaded(_name: &str) -> Option<Library> {
    None
}
