//! The CUDA backend: what it does without a driver (every machine), and, on a machine with
//! an NVIDIA driver and GPU, device memory and kernel launches on it. The GPU tests say
//! "skipped" with the reason where there is none, so a run shows what it did not check.

mod common;

use common::{assert_all_reduce_sums, exchange_over_both_rings, exchange_over_port_ring};
use oxccl::collectives::CollectiveConfig;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Backend, CommunicatorConfig, Device, Error, TransportChoice};
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::device_check::fill_sequence;
use std::time::{Duration, Instant};

/// The reason the CUDA backend cannot be used here, or `None` if it can.
fn no_cuda() -> Option<String> {
    Backend::cuda_device_count().err().map(|e| e.to_string())
}

/// A CUDA device, or `None` after printing why the calling test is skipped.
fn gpu(test: &str) -> Option<Device> {
    match no_cuda() {
        Some(why) => {
            println!("{test}: skipped: {why}");
            None
        }
        None => Some(Device::new(Backend::Cuda, 0).expect("open cuda device 0")),
    }
}

/// Guards against a machine without an NVIDIA driver crashing (cudarc panics on the first
/// call into a library it could not load) or silently running on the emulator when the
/// CUDA backend is asked for by name.
#[test]
fn cuda_backend_without_driver_errors() {
    let Some(why) = no_cuda() else {
        // Not a skip: on a GPU machine the check is that the backend works, below.
        println!(
            "cuda_backend_without_driver_errors: not applicable: a CUDA driver and device are present"
        );
        return;
    };
    let err = Device::new(Backend::Cuda, 0).unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable(_)), "{err}");
    assert_eq!(
        err.to_string(),
        why,
        "the device error and the backend's reason differ"
    );
    assert!(
        why.contains("libcuda") || why.contains("cuInit") || why.contains("no device"),
        "{why}"
    );
}

/// Guards against `auto` picking a backend that cannot run here, or not picking the GPU
/// where there is one.
#[test]
fn auto_backend_falls_back_to_cpu() {
    let device = Device::new(Backend::Auto, 0).unwrap();
    let want = if no_cuda().is_some() {
        Backend::Cpu
    } else {
        Backend::Cuda
    };
    assert_eq!(device.backend(), want);
    assert_eq!(Backend::Auto.resolve(), want);
    // Whatever it picked works.
    let buf = device.alloc_from(&[5u32, 6, 7]).unwrap();
    assert_eq!(buf.to_vec().unwrap(), [5, 6, 7]);
}

/// Guards the communicator on a GPU for ranks as threads of one process (they share GPU 0
/// where there is one, as on the GPU bundle's machine): registration, port channels (each
/// rank's proxy polls a FIFO in mapped host memory and copies through a CUDA IPC
/// connection's stream), memory channels (the peer's memory at its own address), and the
/// communicator's all-reduce, staged and zero-copy (the peers' registered buffers read and
/// written in place), each rank finding what the other sent. The same job runs on
/// the emulator first, so both backends answer the same checks.
#[test]
fn communicator_of_two_ranks_in_one_process() {
    let mut backends = vec![Backend::Cpu];
    match no_cuda() {
        None => backends.push(Backend::Cuda),
        Some(why) => {
            println!("communicator_of_two_ranks_in_one_process: the cuda part is skipped: {why}")
        }
    }
    for backend in backends {
        let config = InProcessConfig {
            communicator: CommunicatorConfig {
                wait_timeout: Duration::from_secs(20),
                proxy_assist: false,
                ..Default::default()
            },
            exchange_timeout: Duration::from_secs(20),
            backend,
        };
        let started = Instant::now();
        in_process::run(2, config, |comm| {
            assert_eq!(comm.device().backend(), backend);
            let stream = comm.device().stream()?;

            exchange_over_both_rings(comm, &stream, 4099, 32)?;

            let value = |r: u32, i: usize| ((i * 7 + r as usize * 13) % 101) as f32;
            assert_all_reduce_sums(comm, &stream, 10_007, value, "all-reduce", false)?;
            assert_all_reduce_sums(comm, &stream, 10_007, value, "zero-copy", true)?;
            comm.barrier()
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        println!(
            "communicator of two ranks in one process on {backend:?}: port ring, memory ring, \
             all-reduce and zero-copy all-reduce in {:?}",
            started.elapsed()
        );
    }
}

/// Guards the Ethernet transport from a GPU's memory (two ranks as threads sharing GPU 0
/// where there is one): every put is copied out of the device into a pinned buffer before
/// it is sent, copied into the peer's device after it arrived, and the signal written
/// behind it on the receiver's stream. A port ring (puts larger than a chunk) and an
/// all-reduce over port channels, each rank checking what the other sent. On the emulator
/// first, its memory staged the same way (`ethernet_staging`), so both backends answer the
/// same checks.
#[test]
fn ethernet_from_device_memory_is_staged() {
    let mut backends = vec![Backend::Cpu];
    match no_cuda() {
        None => backends.push(Backend::Cuda),
        Some(why) => {
            println!("ethernet_from_device_memory_is_staged: the cuda part is skipped: {why}")
        }
    }
    for backend in backends {
        let config = InProcessConfig {
            communicator: CommunicatorConfig {
                wait_timeout: Duration::from_secs(20),
                transport: TransportChoice::Ethernet,
                ethernet_staging: true,
                // The all-reduce below in several rounds (4 of 128 KiB).
                collectives: CollectiveConfig {
                    port_round_bytes: 128 << 10,
                    ..Default::default()
                },
                ..Default::default()
            },
            exchange_timeout: Duration::from_secs(20),
            backend,
        };
        let started = Instant::now();
        in_process::run(2, config, |comm| {
            let stream = comm.device().stream()?;
            exchange_over_port_ring(comm, &stream, 70_001)?;
            let value = |r: u32, i: usize| ((i * 7 + r as usize * 13) % 101) as f32;
            assert_all_reduce_sums(
                comm,
                &stream,
                100_003,
                value,
                "all-reduce over ports",
                false,
            )?;
            comm.barrier()
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        println!(
            "Ethernet from {backend:?} memory, staged: port ring and all-reduce in {:?}",
            started.elapsed()
        );
    }
}

/// Guards against memory of one backend registered with a communicator of the other: the
/// error names both, instead of a region the proxy or a kernel cannot reach.
#[test]
fn a_buffer_of_another_backend_is_refused_by_register() {
    let Some(gpu) = gpu("a_buffer_of_another_backend_is_refused_by_register") else {
        return;
    };
    in_process::run(1, InProcessConfig::default(), |comm| {
        let foreign = gpu.alloc::<u32>(16)?;
        let err = comm.register(&foreign).unwrap_err();
        assert!(matches!(err, Error::InvalidUsage(_)), "{err}");
        assert!(err.to_string().contains("cannot be registered"), "{err}");
        Ok(())
    })
    .unwrap();
}

/// Guards against a first launch that compiles the kernels' PTX on the spot (over a
/// minute for the collectives' module) where the cubin built beside it would load at once:
/// prints how long the first launch on a fresh device took, module load included. Run it
/// with `CUDA_CACHE_DISABLE=1` to see the driver's compile time when
/// `OXCCL_KERNEL_IMAGE=ptx`.
#[test]
fn cuda_first_launch_loads_the_kernels() {
    let Some(device) = gpu("cuda_first_launch_loads_the_kernels") else {
        return;
    };
    let stream = device.stream().unwrap();
    let out = device.alloc::<u32>(1024).unwrap();
    let started = std::time::Instant::now();
    fill_sequence::launch(&stream, LaunchConfig::grid(4).block(256), out.view_mut(), 3).unwrap();
    stream.synchronize().unwrap();
    let first = started.elapsed();
    let started = std::time::Instant::now();
    fill_sequence::launch(&stream, LaunchConfig::grid(4).block(256), out.view_mut(), 5).unwrap();
    stream.synchronize().unwrap();
    let second = started.elapsed();
    assert!(
        out.to_vec()
            .unwrap()
            .iter()
            .enumerate()
            .all(|(i, &v)| v == 5 + i as u32)
    );
    println!(
        "first launch (kernel module load included): {:.1} ms; the next: {:.3} ms; kernels \
         from {}",
        first.as_secs_f64() * 1e3,
        second.as_secs_f64() * 1e3,
        match std::env::var("OXCCL_KERNEL_IMAGE").as_deref() {
            Ok("ptx") => "the PTX (OXCCL_KERNEL_IMAGE=ptx)",
            _ => "the cubin if one runs here, else the PTX",
        }
    );
}

/// Guards against a rank failing where there are more ranks than GPUs (two processes may
/// share one): rank `n` of a node with `n` GPUs opens GPU 0, and it works.
#[test]
fn ranks_beyond_the_gpu_count_share_a_gpu() {
    let Some(_) = gpu("ranks_beyond_the_gpu_count_share_a_gpu") else {
        return;
    };
    let gpus = Backend::cuda_device_count().unwrap() as usize;
    let device = Device::for_local_rank(Backend::Cuda, gpus).unwrap();
    assert_eq!((device.backend(), device.ordinal()), (Backend::Cuda, 0));
    assert_eq!(
        device.alloc_from(&[1u8, 2]).unwrap().to_vec().unwrap(),
        [1, 2]
    );
}

/// Guards against copies that lose or shift bytes between host and GPU memory.
#[test]
fn cuda_buffer_round_trip() {
    let Some(device) = gpu("cuda_buffer_round_trip") else {
        return;
    };
    let data: Vec<u64> = (0..100_003).map(|i| i * 0x9e37_79b9).collect();
    let mut buf = device.alloc_from(&data).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    buf.copy_from_host_at(7, &[1, 2, 3]).unwrap();
    let mut part = [0u64; 5];
    buf.copy_to_host_at(6, &mut part).unwrap();
    assert_eq!(part, [data[6], 1, 2, 3, data[10]]);
    buf.fill(42).unwrap();
    assert!(buf.to_vec().unwrap().iter().all(|&v| v == 42));
    buf.zero().unwrap();
    assert!(buf.to_vec().unwrap().iter().all(|&v| v == 0));
    let zeroed = device.alloc_zeroed::<u8>(4097).unwrap();
    assert!(zeroed.to_vec().unwrap().iter().all(|&v| v == 0));
    assert!(
        buf.copy_from_host_at(100_000, &[0; 4]).is_err(),
        "past the end"
    );
}

/// Guards against a kernel that does not run on the GPU, runs with wrong indices or
/// parameters, or whose writes `synchronize` does not wait for.
#[test]
fn cuda_kernel_fills_a_buffer() {
    let Some(device) = gpu("cuda_kernel_fills_a_buffer") else {
        return;
    };
    let stream = device.stream().unwrap();
    let n = 1_000_003usize;
    let out = device.alloc::<u32>(n).unwrap();
    for config in [
        LaunchConfig::grid(1).block(1),
        LaunchConfig::grid(80).block(256),
    ] {
        fill_sequence::launch(&stream, config, out.view_mut(), 1000).unwrap();
        stream.synchronize().unwrap();
        let got = out.to_vec().unwrap();
        let wrong = (0..n).filter(|&i| got[i] != 1000 + i as u32).count();
        assert_eq!(wrong, 0, "{config:?}: {wrong} wrong elements");
    }
}

/// Guards against the emulator dereferencing GPU memory on the host (a crash, or another
/// mapping's bytes): a view of a CUDA buffer passed to a launch on a CPU stream is refused
/// with the reason, inside a struct argument too, while CPU buffers still launch.
#[test]
fn cpu_launch_refuses_a_view_of_gpu_memory() {
    let Some(gpu) = gpu("cpu_launch_refuses_a_view_of_gpu_memory") else {
        return;
    };
    let on_gpu = gpu.alloc_zeroed::<u32>(1024).unwrap();
    let cpu = Device::cpu(0);
    let stream = cpu.stream().unwrap();
    let err = fill_sequence::launch(
        &stream,
        LaunchConfig::grid(1).block(32),
        on_gpu.view_mut(),
        1,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidUsage(_)), "{err}");
    assert!(err.to_string().contains("CUDA device memory"), "{err}");
    // The GPU buffer is untouched, and a CPU buffer launches as ever.
    assert!(on_gpu.to_vec().unwrap().iter().all(|&v| v == 0));
    let on_cpu = cpu.alloc::<u32>(1024).unwrap();
    fill_sequence::launch(
        &stream,
        LaunchConfig::grid(1).block(32),
        on_cpu.view_mut(),
        1,
    )
    .unwrap();
    stream.synchronize().unwrap();
    assert!(
        on_cpu
            .to_vec()
            .unwrap()
            .iter()
            .enumerate()
            .all(|(i, &v)| v == 1 + i as u32)
    );
}

/// Guards against a CPU device accepting a foreign CUDA stream, or a CPU stream claiming to
/// have one.
#[test]
fn cuda_stream_interop_refuses_the_cpu_backend() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    assert!(stream.cuda_stream().is_none());
    // SAFETY: refused before the pointer is used.
    let err =
        unsafe { oxccl::Stream::from_cuda_stream(&device, std::ptr::null_mut()) }.unwrap_err();
    assert!(matches!(err, Error::InvalidUsage(_)), "{err}");
}

/// Guards against oxccl's launches and a cudarc user's work on one stream not running in
/// order, or a borrowed stream being destroyed under its owner.
#[test]
fn cuda_kernel_runs_on_a_cudarc_stream() {
    let Some(device) = gpu("cuda_kernel_runs_on_a_cudarc_stream") else {
        return;
    };
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let theirs = ctx.new_stream().unwrap();
    // SAFETY: the stream belongs to device 0's primary context and outlives `ours`.
    let ours =
        unsafe { oxccl::Stream::from_cuda_stream(&device, theirs.cu_stream().cast()) }.unwrap();
    assert_eq!(ours.cuda_stream(), Some(theirs.cu_stream().cast()));
    let out = device.alloc::<u32>(4096).unwrap();
    fill_sequence::launch(&ours, LaunchConfig::grid(4).block(128), out.view_mut(), 7).unwrap();
    ours.synchronize().unwrap();
    drop(ours);
    theirs.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == 7 + i as u32));
}
