//! The CUDA kernels' sources and their compilation by NVRTC: to PTX for a virtual architecture (what CI checks for
//! compute_75/80/90), or, at start-up, to a CUBIN for the exact GPU so the driver has nothing to JIT-compile (a
//! driver older than the NVRTC would refuse that NVRTC's PTX, but runs its CUBINs).

use std::ffi::{CString, c_char};

use cudarc::nvrtc::{result, sys};

use crate::gpu::GpuError;

/// `kernels/embedding_gather.cu`, built into the binary.
pub(crate) const EMBEDDING_GATHER_SRC: &str =
    include_str!("../../../../kernels/embedding_gather.cu");
/// The entry point in [`EMBEDDING_GATHER_SRC`].
pub(crate) const EMBEDDING_GATHER: &str = "embedding_gather";

/// Virtual architectures the kernels must compile for: Turing (T4), Ampere (A100), Hopper (H100).
#[cfg(test)]
pub(crate) const CI_ARCHES: [u32; 3] = [75, 80, 90];

/// Options for every compilation. `--fmad=false` keeps any `a * b + c` the compiler sees from becoming an FMA (the
/// kernel also spells its arithmetic with `__fmul_rn`/`__fadd_rn`), so results equal the CPU's bit for bit.
const OPTIONS: [&str; 1] = ["--fmad=false"];

/// What NVRTC should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// PTX for `compute_XY`, which the driver compiles for the GPU when loading it.
    Ptx(u32),
    /// Machine code for `sm_XY`.
    Cubin(u32),
}

impl Target {
    fn arch_option(self) -> String {
        match self {
            Target::Ptx(arch) => format!("--gpu-architecture=compute_{arch}"),
            Target::Cubin(arch) => format!("--gpu-architecture=sm_{arch}"),
        }
    }

    fn arch_name(self) -> String {
        match self {
            Target::Ptx(arch) => format!("compute_{arch}"),
            Target::Cubin(arch) => format!("sm_{arch}"),
        }
    }
}

/// Whether libnvrtc can be loaded (cudarc panics on first use when it cannot).
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names.
    unsafe { sys::is_culib_present() }
}

fn nvrtc_error(call: &str, e: result::NvrtcError) -> String {
    format!("{call}: {e:?}")
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by create_program and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn log_text(log: &[c_char]) -> String {
    let bytes: Vec<u8> = log
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

/// Compiles `src` for `target`; returns the PTX text (NUL-terminated) or the CUBIN bytes.
pub(crate) fn compile(src: &str, name: &'static str, target: Target) -> Result<Vec<u8>, GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    let fail = |message: String| GpuError::Compile {
        kernel: name,
        arch: target.arch_name(),
        message,
    };
    let c_src = CString::new(src).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let c_name = CString::new(format!("{name}.cu")).map_err(|_| fail("bad name".into()))?;
    let program = Program(
        result::create_program(&c_src, Some(c_name.as_c_str()))
            .map_err(|e| fail(nvrtc_error("nvrtcCreateProgram", e)))?,
    );
    let mut options: Vec<String> = OPTIONS.iter().map(|o| (*o).to_owned()).collect();
    options.push(target.arch_option());
    // SAFETY: `program` is a live program from create_program.
    if let Err(e) = unsafe { result::compile_program(program.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program.0) }
            .map(|l| log_text(&l))
            .unwrap_or_default();
        return Err(fail(format!(
            "{} (options {options:?}):\n{log}",
            nvrtc_error("nvrtcCompileProgram", e)
        )));
    }
    match target {
        Target::Ptx(_) => {
            // SAFETY: the program compiled.
            let ptx = unsafe { result::get_ptx(program.0) }
                .map_err(|e| fail(nvrtc_error("nvrtcGetPTX", e)))?;
            Ok(ptx.into_iter().map(|c| c as u8).collect())
        }
        Target::Cubin(_) => {
            let mut size = 0usize;
            // SAFETY: the program compiled for a real architecture, so it has a CUBIN of `size` bytes.
            unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size).result() }
                .map_err(|e| fail(nvrtc_error("nvrtcGetCUBINSize", e)))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds `size` bytes.
            unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast()).result() }
                .map_err(|e| fail(nvrtc_error("nvrtcGetCUBIN", e)))?;
            Ok(cubin)
        }
    }
}

/// PTX of the embedding gather for `compute_{arch}`, as text (the compilation check of the kernels).
#[cfg(test)]
pub(crate) fn embedding_gather_ptx(arch: u32) -> Result<String, GpuError> {
    let bytes = compile(EMBEDDING_GATHER_SRC, EMBEDDING_GATHER, Target::Ptx(arch))?;
    let text = std::ffi::CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    Ok(text)
}

/// The architectures (`XY` of `sm_XY`) this NVRTC can compile for.
pub(crate) fn supported_arches() -> Result<Vec<u32>, GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    let fail = |e: result::NvrtcError| GpuError::Compile {
        kernel: EMBEDDING_GATHER,
        arch: "any".into(),
        message: nvrtc_error("nvrtcGetSupportedArchs", e),
    };
    let mut count = 0i32;
    // SAFETY: writes one int.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut count).result() }.map_err(fail)?;
    let mut arches = vec![0i32; usize::try_from(count).unwrap_or(0)];
    // SAFETY: `arches` holds `count` ints.
    unsafe { sys::nvrtcGetSupportedArchs(arches.as_mut_ptr()).result() }.map_err(fail)?;
    Ok(arches
        .into_iter()
        .filter_map(|a| u32::try_from(a).ok())
        .collect())
}

/// How to build the kernels for a GPU of compute capability `cc`: a CUBIN for it when this NVRTC knows the
/// architecture, else PTX for the newest architecture it knows below it (the driver compiles that forward), else
/// an error.
pub(crate) fn target_for(cc: (i32, i32), supported: &[u32]) -> Result<Target, GpuError> {
    let arch = u32::try_from(cc.0 * 10 + cc.1).unwrap_or(0);
    if supported.contains(&arch) {
        return Ok(Target::Cubin(arch));
    }
    supported
        .iter()
        .copied()
        .filter(|&a| a <= arch)
        .max()
        .map(Target::Ptx)
        .ok_or_else(|| GpuError::Compile {
            kernel: EMBEDDING_GATHER,
            arch: format!("sm_{arch}"),
            message: format!(
                "this NVRTC supports only {supported:?}; use an NVRTC of the CUDA version that supports this GPU"
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Not a device test: NVRTC runs on the CPU. Fails (never skips) when libnvrtc is missing, because CI must
    /// prove the kernels compile for every GPU generation we deploy on.
    #[test]
    fn embedding_gather_compiles_to_ptx_for_t4_a100_and_h100() {
        assert!(
            nvrtc_present(),
            "libnvrtc cannot be loaded: run scripts/setup.sh and `source scripts/env.sh`, which put the \
             nvidia-cuda-nvrtc wheel's lib directory on LD_LIBRARY_PATH"
        );
        for arch in CI_ARCHES {
            let ptx = embedding_gather_ptx(arch).unwrap_or_else(|e| panic!("compute_{arch}: {e}"));
            assert!(
                ptx.contains(&format!(".target sm_{arch}")),
                "compute_{arch}: PTX for the wrong target:\n{}",
                &ptx[..ptx.len().min(400)]
            );
            assert!(
                ptx.contains(".visible .entry embedding_gather("),
                "compute_{arch}: no embedding_gather entry point"
            );
            // The fused int8 dequantization must stay a separately rounded multiply and add, never an FMA.
            assert!(!ptx.contains("fma."), "compute_{arch}: the PTX has an FMA");
            assert!(
                ptx.contains("mul.rn.f32") && ptx.contains("add.rn.f32"),
                "compute_{arch}: no round-to-nearest multiply/add (int8 dequantization)"
            );
            // Vector loads for the aligned cases (fp32 float4, fp16 8 halves, int8 8 codes).
            assert!(
                ptx.contains("ld.global.nc.v4.f32") && ptx.contains("ld.global.nc.v4.u32"),
                "compute_{arch}: no 16-byte vector loads"
            );
            assert!(
                ptx.contains("cvt.f32.f16"),
                "compute_{arch}: no fp16 conversion"
            );
        }
    }

    #[test]
    fn compile_errors_carry_the_log() {
        if !nvrtc_present() {
            panic!("libnvrtc cannot be loaded: run scripts/setup.sh and `source scripts/env.sh`");
        }
        let err = compile(
            "extern \"C\" __global__ void k() { undefined_thing(); }",
            "broken",
            Target::Ptx(80),
        )
        .expect_err("does not compile");
        let text = err.to_string();
        assert!(
            text.contains("compute_80") && text.contains("undefined_thing"),
            "{text}"
        );
    }

    #[test]
    fn picks_a_cubin_for_known_gpus_and_ptx_for_newer_ones() {
        let supported = [75, 80, 86, 89, 90];
        assert_eq!(
            target_for((7, 5), &supported).expect("T4"),
            Target::Cubin(75)
        );
        assert_eq!(
            target_for((9, 0), &supported).expect("H100"),
            Target::Cubin(90)
        );
        assert_eq!(
            target_for((12, 0), &supported).expect("newer"),
            Target::Ptx(90)
        );
        assert_eq!(
            target_for((8, 7), &supported).expect("Orin"),
            Target::Ptx(86)
        );
        assert!(target_for((7, 0), &supported).is_err());
    }
}
