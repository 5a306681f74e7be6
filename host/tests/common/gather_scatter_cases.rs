//! The all-gather and reduce-scatter checks the port and ring tests share: each call made
//! out of place and in place, every result read back with a marker after it, compared bit
//! for bit.

use super::{assert_same, small_value as value};
use oxccl::{Communicator, DeviceBuffer, ReduceElement, ReduceOp, Result, Stream};

/// Rank `rank`'s `len` input elements of call `call`.
pub fn inputs<T: ReduceElement>(rank: u32, len: usize, call: u32) -> Vec<T> {
    (0..len).map(|i| value::<T>(rank, i, call)).collect()
}

/// `data` and a marker after it, on the device: a kernel that writes past the data shows.
pub fn marked<T: ReduceElement>(comm: &Communicator, data: &[T]) -> Result<DeviceBuffer<T>> {
    let mut host = data.to_vec();
    host.push(T::from_f64(99.0));
    comm.device().alloc_from(&host)
}

/// The first `len` elements of `buf`, after checking the marker after them.
pub fn read<T: ReduceElement>(what: &str, buf: &DeviceBuffer<T>, len: usize) -> Result<Vec<T>> {
    let mut got = buf.to_vec()?;
    assert_eq!(got[len].to_f64(), 99.0, "{what}: wrote past the data");
    got.truncate(len);
    Ok(got)
}

/// An all-gather of `count` elements a rank (call `call`), out of place and in place.
pub fn all_gather_case<T: ReduceElement>(
    comm: &mut Communicator,
    count: usize,
    call: u32,
    stream: &Stream,
) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let nu = n as usize;
    let what = |c: &str| format!("{c} {:?} n={count} ranks={n}", T::TYPE);
    let zeros = vec![T::from_f64(0.0); count * nu];
    let want: Vec<T> = (0..n).flat_map(|p| inputs::<T>(p, count, call)).collect();
    let send = marked(comm, &inputs::<T>(rank, count, call))?;
    let mut recv = marked(comm, &zeros)?;
    comm.all_gather(&send, &mut recv, count, stream)?;
    let mut mine = zeros.clone();
    mine[rank as usize * count..][..count].copy_from_slice(&inputs::<T>(rank, count, call));
    let mut in_place = marked(comm, &mine)?;
    comm.all_gather_in_place(&mut in_place, count, stream)?;
    comm.synchronize(stream)?;
    assert_same(&what("all_gather"), &read("", &recv, count * nu)?, &want);
    let got = read("all_gather in place", &in_place, count * nu)?;
    assert_same(&what("all_gather in place"), &got, &want);
    Ok(())
}

/// A reduce-scatter by `op` of `count` elements a block (call `call`), out of place and in
/// place (the rest of the buffer as it was); `want(i)` is element `i` of this rank's block.
pub fn reduce_scatter_case<T: ReduceElement>(
    comm: &mut Communicator,
    count: usize,
    call: u32,
    op: ReduceOp,
    stream: &Stream,
    want: impl Fn(usize) -> T,
) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let nu = n as usize;
    let what = format!("reduce_scatter {op:?} {:?} n={count} ranks={n}", T::TYPE);
    let zeros = vec![T::from_f64(0.0); count];
    let want: Vec<T> = (0..count).map(want).collect();
    let whole = inputs::<T>(rank, count * nu, call);
    let send = marked(comm, &whole)?;
    let mut recv = marked(comm, &zeros)?;
    comm.reduce_scatter(&send, &mut recv, count, op, stream)?;
    let mut in_place = marked(comm, &whole)?;
    comm.reduce_scatter_in_place(&mut in_place, count, op, stream)?;
    comm.synchronize(stream)?;
    assert_same(&what, &read(&what, &recv, count)?, &want);
    let mut want_whole = whole.clone();
    want_whole[rank as usize * count..][..count].copy_from_slice(&want);
    let got = read(&what, &in_place, count * nu)?;
    assert_same(&format!("{what} in place"), &got, &want_whole);
    Ok(())
}
