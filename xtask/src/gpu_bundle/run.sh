#!/usr/bin/env bash
# oxccl GPU checks: one line per step, `gpu-check <step> ok|FAILED <figure>`.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
logs="${OUT:-$here/logs}"
mkdir -p "$logs"
tar -xzf "$here/ptx.tar.gz" -C "$logs" || { echo "gpu-check unpack FAILED cannot unpack ptx.tar.gz into $logs"; exit 1; }
export OXCCL_PTX_DIR="$logs/ptx"
export OXCCL_BACKEND=cuda
failed=0

# step NAME SECONDS FIGURE_PATTERN COMMAND...: runs COMMAND with a deadline, logs its output,
# prints the last line matching FIGURE_PATTERN as the figure.
step() {
    local name="$1" limit="$2" pattern="$3"
    shift 3
    local log="$logs/$name.log"
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    local rc=$?
    local figure
    figure="$(grep -E "$pattern" "$log" | tail -n 1 | cut -c1-200)"
    if [ $rc -eq 0 ] && ! grep -q "skipped:" "$log"; then
        echo "gpu-check $name ok $figure"
    else
        [ $rc -eq 124 ] && figure="timed out after ${limit}s; $figure"
        grep -q "skipped:" "$log" && figure="skipped on a GPU machine: $(grep -m1 'skipped:' "$log")"
        [ -z "$figure" ] && figure="$(tail -n 3 "$log" | tr '\n' ' ' | cut -c1-300)"
        echo "gpu-check $name FAILED rc=$rc $figure"
        failed=1
    fi
}

echo "# $(date -u +%FT%TZ) $(uname -srm)"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/# gpu: /'
ldd --version 2>/dev/null | head -n 1 | sed 's/^/# /'

# The first launch loads the kernels from their cubin; with GPU_CHECK_JIT=1, also (for
# comparison, the driver's cache off) compiled from the PTX, which takes minutes.
step first-launch-cubin 120 "first launch" env CUDA_CACHE_DISABLE=1 "$here/bin/cuda_backend" cuda_first_launch --nocapture
if [ "${GPU_CHECK_JIT:-0}" = 1 ]; then
    step first-launch-ptx 400 "first launch" env CUDA_CACHE_DISABLE=1 OXCCL_KERNEL_IMAGE=ptx "$here/bin/cuda_backend" cuda_first_launch --nocapture
fi
step tests 600 "test result" "$here/bin/cuda_backend" --nocapture --test-threads=1
step device-checks 300 "collective all-reduce" "$here/bin/device_checks" --nocapture --test-threads=1
step bad-input 300 "test result" "$here/bin/bad_input" --test-threads=1
step registered-memory 120 "test result" "$here/bin/registered_memory" --nocapture --test-threads=1
step port-memory-ids 120 "test result" "$here/bin/port_memory_ids" --nocapture --test-threads=1
step launch 120 "^launch " "$here/bin/launch_bench" --backend cuda --threads 1,256 --streams 1,2 --iters 2000 --runs 3
step fifo-rtt 120 "^fifo_rtt " "$here/bin/fifo_bench" --round-trip --backend cuda --items 20000
step pingpong-port 300 "^pingpong " "$here/bin/pingpong" --backend cuda --channel port --iters 2000
step pingpong-memory 300 "^pingpong " "$here/bin/pingpong" --backend cuda --channel memory --iters 2000
step allreduce 600 "^ +[0-9]+ " "$here/bin/allreduce" --backend cuda --ranks 2 --processes --max-bytes 64M

exit $failed
