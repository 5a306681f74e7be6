/*
 * Baseline for oxccl's allreduce benchmark: MPI_Allreduce (sum of float) timed exactly as
 * the oxccl program times its kernel. For each size: warm-up calls, then `iters` calls
 * back to back; the time of a size is the slowest rank's mean. Out of place, then in place
 * (MPI_IN_PLACE). The result is checked against the expected sum.
 *
 * Usage: allreduce_mpi <min_bytes> <max_bytes> <step_factor> <iters> <warmup>
 * Output (rank 0), one line per size: <bytes> <out-of-place us> <in-place us> <wrong>
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static float value(int rank, long i) { return (float)((i * 7 + (long)rank * 13) % 101); }

static double timed(float *in, float *out, long n, int iters, int warmup, int in_place) {
    const void *send = in_place ? MPI_IN_PLACE : (const void *)in;
    for (int i = 0; i < warmup; i++) MPI_Allreduce(send, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iters; i++) MPI_Allreduce(send, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - start) * 1e6 / iters, slowest = 0;
    MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (argc != 6) {
        if (rank == 0) fprintf(stderr, "usage: %s min_bytes max_bytes step_factor iters warmup\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long min = atol(argv[1]), max = atol(argv[2]), factor = atol(argv[3]);
    int iters = atoi(argv[4]), warmup = atoi(argv[5]);
    if (min < 4) min = 4;
    if (factor < 2) factor = 2;
    if (iters < 1) iters = 1;
    long max_n = max / 4 + 1;
    float *in = malloc(sizeof(float) * max_n), *out = malloc(sizeof(float) * max_n);
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 1);
    for (long bytes = min; bytes <= max; bytes *= factor) {
        long n = bytes / 4;
        double t[2];
        long wrong = 0;
        for (int in_place = 0; in_place < 2; in_place++) {
            for (long i = 0; i < n; i++) in[i] = out[i] = value(rank, i);
            t[in_place] = timed(in, out, n, 1, 0, in_place);  /* one checked call */
            for (long i = 0; i < n; i++) {
                float want = 0;
                for (int r = 0; r < ranks; r++) want += value(r, i);
                if (out[i] != want) wrong++;
            }
            t[in_place] = timed(in, out, n, iters, warmup, in_place);
        }
        long all_wrong = 0;
        MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.3f %.3f %ld\n", bytes, t[0], t[1], all_wrong);
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
