//! Device views in real launches on the CPU emulator: safe kernels over device buffers.
#![allow(missing_docs)]

use oxccl::{Device, Error};
use oxccl_device::coop::{Block, Coop, Grid};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DeviceError, DeviceView, DeviceViewMut, arch, kernel};

/// `out[i] = a * x[i] + y[i]`, one element per thread of the grid.
#[kernel]
fn saxpy(
    out: DeviceViewMut<'_, f32>,
    a: f32,
    x: DeviceView<'_, f32>,
    y: DeviceView<'_, f32>,
) -> Result<(), DeviceError> {
    let i = arch::thread_rank_in_grid();
    out.set(i, a * x.get(i)? + y.get(i)?)
}

/// Guards against a view that reads or writes the wrong element, or the wrong bits of one.
#[test]
fn safe_kernel_over_views() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let x = device
        .alloc_from(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    let y = device.alloc_from(&[0.5f32; 6]).unwrap();
    let out = device.alloc::<f32>(6).unwrap();
    saxpy::launch(
        &stream,
        LaunchConfig::grid(2).block(3),
        out.view_mut(),
        2.0,
        x.view(),
        y.view(),
    )
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [2.5, 4.5, 6.5, 8.5, 10.5, 12.5]);
}

/// Guards against a launch of more threads than elements writing past the end of a buffer
/// (what the raw-address kernel this replaces would do): the extra threads' accesses are
/// refused, the launch reports which access failed, and nothing past the buffer changes.
#[test]
fn out_of_range_access_is_an_error_of_the_launch() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    // One buffer, viewed in two parts: the kernel gets the first four elements only.
    let backing = device.alloc_from(&[7.0f32; 8]).unwrap();
    let x = device.alloc_from(&[1.0f32; 8]).unwrap();
    let part = backing.view_mut().slice(0..4).unwrap();
    saxpy::launch(
        &stream,
        LaunchConfig::grid(1).block(8),
        part,
        1.0,
        x.view(),
        x.view(),
    )
    .unwrap();
    let err = stream.synchronize().unwrap_err();
    match &err {
        Error::KernelError {
            kernel,
            error,
            message,
        } => {
            assert_eq!(*kernel, "saxpy");
            assert_eq!(*error, DeviceError::OutOfRange);
            assert!(message.contains("a device view access"), "{message}");
            assert!(message.contains("more threads failed"), "{message}");
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(
        backing.to_vec().unwrap(),
        [2.0, 2.0, 2.0, 2.0, 7.0, 7.0, 7.0, 7.0]
    );
    // The stream stays usable.
    saxpy::launch(
        &stream,
        LaunchConfig::grid(1).block(4),
        part,
        0.0,
        x.view(),
        x.view(),
    )
    .unwrap();
    stream.synchronize().unwrap();
}

/// Every thread of the grid writes its rank into the same element, many times.
#[kernel]
fn all_write_one(cell: DeviceViewMut<'_, u64>, rounds: u32) -> Result<(), DeviceError> {
    let me = arch::thread_rank_in_grid();
    for r in 0..rounds as u64 {
        cell.set(0, (me << 32) | r)?;
    }
    Ok(())
}

/// Guards against concurrent writes of one element being anything but what the docs say:
/// the value left is unspecified, here one of the values written (each is one word), and
/// nothing outside the element changes. It is not prevented, as it is not on a GPU.
#[test]
fn concurrent_writes_leave_one_of_the_values() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let cells = device.alloc_from(&[u64::MAX; 2]).unwrap();
    let one = cells.view_mut().slice(0..1).unwrap();
    let (blocks, threads, rounds) = (2u32, 4u32, 1000u32);
    all_write_one::launch(
        &stream,
        LaunchConfig::grid(blocks).block(threads),
        one,
        rounds,
    )
    .unwrap();
    stream.synchronize().unwrap();
    let got = cells.to_vec().unwrap();
    let (writer, round) = (got[0] >> 32, got[0] & 0xffff_ffff);
    assert!(writer < u64::from(blocks * threads) && round < u64::from(rounds));
    assert_eq!(got[1], u64::MAX, "the element beside it");
}

/// Copies `src` into the middle of `dst` with the block, fills the rest with the grid, and
/// doubles each element of the copy (one thread per element, as the split deals them).
#[kernel(max_blocks = 1)]
fn copy_fill_double(
    dst: DeviceViewMut<'_, i32>,
    src: DeviceView<'_, i32>,
) -> Result<(), DeviceError> {
    let n = src.len();
    dst.slice(0..2)?.fill(Grid, -1);
    let middle = dst.slice(2..2 + n)?;
    middle.copy_from(Block, src)?;
    dst.slice(2 + n..dst.len())?.fill(Block, -2);
    // The copy's shares were split differently from the loop below.
    arch::sync_threads();
    for i in Block.split(n) {
        middle.set(i, 2 * middle.get(i)?)?;
    }
    Ok(())
}

/// Guards against bulk copies and fills through views that miss or repeat elements, write
/// outside their sub-view, or cannot be read back by other threads after a barrier.
#[test]
fn bulk_copies_and_fills_through_sub_views() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let src: Vec<i32> = (0..1001).collect();
    let src_buf = device.alloc_from(&src).unwrap();
    let dst = device.alloc::<i32>(1006).unwrap();
    copy_fill_double::launch(
        &stream,
        LaunchConfig::grid(1).block(3),
        dst.view_mut(),
        src_buf.view(),
    )
    .unwrap();
    stream.synchronize().unwrap();
    let got = dst.to_vec().unwrap();
    assert_eq!(got[..2], [-1, -1]);
    assert!(got[2..1003].iter().copied().eq((0..1001).map(|v| 2 * v)));
    assert_eq!(got[1003..], [-2, -2, -2]);
}
