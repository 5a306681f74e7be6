/*
 * Baseline of oxccl's collective benchmarks (`allreduce`, `collectives`): one MPI
 * collective timed as the oxccl programs time theirs, with the same counts, element type,
 * operation, root and iterations.
 *
 * For each count, out of place and then in place (MPI_IN_PLACE; MPI_Bcast has one buffer,
 * so both columns time the same call; MPI_Alltoallv is timed out of place only, as oxccl
 * has no in-place all-to-all-v): one checked call from fresh buffers, `warmup` untimed
 * calls, then `iters` timed calls, back to back (`b2b`) or each after a barrier and timed
 * alone (`alone`, oxccl's `--check every`). The time of a count is the slowest rank's mean.
 * Before the first count's timed calls, it is called for `settle_ms` milliseconds more (rank
 * 0's clock decides, in batches doubling from one call), as oxccl's first size is.
 * Inputs are the small integers of oxccl's benchmark (`case.rs`: `value`, seed 0), the
 * reference combines them in rank order in the element type, and outputs start filled with
 * 0xa5 bytes; all-to-all-v sends `count / 2` elements between ranks whose sum is even and
 * `3 * count / 2` otherwise, as `alltoallv_count` in `collective.rs`.
 *
 * Usage: collectives_mpi <collective> <type> <op> <root> <iters> <warmup> <settle_ms> <b2b|alone>
 *        <count>...
 *   collective: allreduce allgather reducescatter broadcast reduce alltoall alltoallv
 *   type: f32 f64 i8 u8 i32 u32 i64 u64 u16 (u16 carries f16 and bf16 for collectives that
 *   only move data); op: sum prod min max (ignored by collectives that do not reduce)
 * Output (rank 0), one line per count: <count> <out-of-place us> <in-place us or -> <wrong>
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F32, F64, I8, U8, I32, U32, I64, U64, U16 };
static const char *TYPE_NAMES[] = {"f32", "f64", "i8", "u8", "i32", "u32", "i64", "u64", "u16"};
static const int TYPE_SIZES[] = {4, 8, 1, 1, 4, 4, 8, 8, 2};
enum { SUM, PROD, MIN, MAX };
static const char *OP_NAMES[] = {"sum", "prod", "min", "max"};
enum { ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST, REDUCE, ALLTOALL, ALLTOALLV };
static const char *COLL_NAMES[] = {"allreduce", "allgather", "reducescatter", "broadcast",
                                   "reduce", "alltoall", "alltoallv"};

static int coll, type, op, root, rank, ranks;
static MPI_Datatype dt;
static MPI_Op mop;

static int lookup(const char *name, const char **names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

static MPI_Datatype mpi_type(int t) {
    switch (t) {
    case F32: return MPI_FLOAT;
    case F64: return MPI_DOUBLE;
    case I8: return MPI_INT8_T;
    case U8: return MPI_UINT8_T;
    case I32: return MPI_INT32_T;
    case U32: return MPI_UINT32_T;
    case I64: return MPI_INT64_T;
    case U64: return MPI_UINT64_T;
    default: return MPI_UINT16_T;
    }
}

/* Element i of buffer b as a double (exact for the values used here). */
static double get(const void *b, long i) {
    switch (type) {
    case F32: return ((const float *)b)[i];
    case F64: return ((const double *)b)[i];
    case I8: return ((const int8_t *)b)[i];
    case U8: return ((const uint8_t *)b)[i];
    case I32: return ((const int32_t *)b)[i];
    case U32: return ((const uint32_t *)b)[i];
    case I64: return (double)((const int64_t *)b)[i];
    case U64: return (double)((const uint64_t *)b)[i];
    default: return ((const uint16_t *)b)[i];
    }
}

/* Stores v as the element type: floats round, integers wrap. */
static void put(void *b, long i, double v) {
    switch (type) {
    case F32: ((float *)b)[i] = (float)v; break;
    case F64: ((double *)b)[i] = v; break;
    case I8: ((int8_t *)b)[i] = (int8_t)(int64_t)v; break;
    case U8: ((uint8_t *)b)[i] = (uint8_t)(int64_t)v; break;
    case I32: ((int32_t *)b)[i] = (int32_t)(int64_t)v; break;
    case U32: ((uint32_t *)b)[i] = (uint32_t)(int64_t)v; break;
    case I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case U64: ((uint64_t *)b)[i] = (uint64_t)(int64_t)v; break;
    default: ((uint16_t *)b)[i] = (uint16_t)(int64_t)v; break;
    }
}

static double value(int r, long i) {
    double v = (double)(((long)r * 7 + i * 13) % 23);
    int unsigned_type = type == U8 || type == U32 || type == U64 || type == U16;
    return unsigned_type ? v + 1 : v - 9;
}

/* a combined with b by the operation, rounded to the element type. */
static double combine(double a, double b) {
    double r = op == SUM ? a + b : op == PROD ? a * b : op == MIN ? (b < a ? b : a) : (b > a ? b : a);
    uint64_t cell[1];
    put(cell, 0, r);
    return get(cell, 0);
}

static double reduced(long i) {
    double acc = value(0, i);
    for (int r = 1; r < ranks; r++) acc = combine(acc, value(r, i));
    return acc;
}

static long vcount(int from, int to, long c) { return (from + to) % 2 == 0 ? c / 2 : 3 * c / 2; }

/* The buffers of one count. */
struct bufs {
    char *send, *recv;
    long c;
    int scounts[64], sdispls[64], rcounts[64], rdispls[64];
};

static void call(struct bufs *b, int in_place) {
    int c = (int)b->c;
    switch (coll) {
    case ALLREDUCE:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : b->send, b->recv, c, dt, mop, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        if (in_place)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->recv, c, dt, MPI_COMM_WORLD);
        else
            MPI_Allgather(b->send, c, dt, b->recv, c, dt, MPI_COMM_WORLD);
        break;
    case REDUCESCATTER:
        MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : b->send, b->recv, c, dt, mop,
                                 MPI_COMM_WORLD);
        break;
    case BROADCAST:
        MPI_Bcast(b->recv, c, dt, root, MPI_COMM_WORLD);
        break;
    case REDUCE:
        if (in_place && rank == root)
            MPI_Reduce(MPI_IN_PLACE, b->recv, c, dt, mop, root, MPI_COMM_WORLD);
        else if (in_place)
            MPI_Reduce(b->recv, NULL, c, dt, mop, root, MPI_COMM_WORLD);
        else
            MPI_Reduce(b->send, b->recv, c, dt, mop, root, MPI_COMM_WORLD);
        break;
    case ALLTOALL:
        if (in_place)
            MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->recv, c, dt, MPI_COMM_WORLD);
        else
            MPI_Alltoall(b->send, c, dt, b->recv, c, dt, MPI_COMM_WORLD);
        break;
    case ALLTOALLV:
        MPI_Alltoallv(b->send, b->scounts, b->sdispls, dt, b->recv, b->rcounts, b->rdispls, dt,
                      MPI_COMM_WORLD);
        break;
    }
}

/* Sets the buffers as a call from fresh inputs expects them. */
static void reset(struct bufs *b, int in_place, long send_len, long recv_len) {
    memset(b->recv, 0xa5, (size_t)recv_len * TYPE_SIZES[type]);
    long c = b->c;
    for (long i = 0; i < send_len; i++) put(b->send, i, value(rank, i));
    if (coll == BROADCAST && rank == root)
        for (long i = 0; i < c; i++) put(b->recv, i, value(rank, i));
    if (!in_place) return;
    switch (coll) {
    case ALLGATHER:
        for (long i = 0; i < c; i++) put(b->recv, rank * c + i, value(rank, i));
        break;
    case BROADCAST:
        break;
    default:
        memcpy(b->recv, b->send, (size_t)send_len * TYPE_SIZES[type]);
    }
}

static long check(struct bufs *b) {
    long c = b->c, wrong = 0;
    switch (coll) {
    case ALLREDUCE:
        for (long i = 0; i < c; i++) wrong += get(b->recv, i) != reduced(i);
        break;
    case REDUCE:
        if (rank == root)
            for (long i = 0; i < c; i++) wrong += get(b->recv, i) != reduced(i);
        break;
    case REDUCESCATTER:
        for (long i = 0; i < c; i++) wrong += get(b->recv, i) != reduced(rank * c + i);
        break;
    case BROADCAST:
        for (long i = 0; i < c; i++) wrong += get(b->recv, i) != value(root, i);
        break;
    case ALLGATHER:
        for (int r = 0; r < ranks; r++)
            for (long i = 0; i < c; i++) wrong += get(b->recv, r * c + i) != value(r, i);
        break;
    case ALLTOALL:
        for (int r = 0; r < ranks; r++)
            for (long i = 0; i < c; i++) wrong += get(b->recv, r * c + i) != value(r, rank * c + i);
        break;
    case ALLTOALLV:
        for (int from = 0; from < ranks; from++) {
            long start = 0;
            for (int to = 0; to < rank; to++) start += vcount(from, to, c);
            for (long i = 0; i < b->rcounts[from]; i++)
                wrong += get(b->recv, b->rdispls[from] + i) != value(from, start + i);
        }
        break;
    }
    return wrong;
}

/* Calls until `ms` milliseconds have passed on rank 0's clock (every rank makes the same
 * calls: rank 0's word decides after each batch). */
static void settle(struct bufs *b, int ms) {
    double start = MPI_Wtime();
    for (long batch = 1;; batch *= 2) {
        for (long i = 0; i < batch; i++) call(b, 0);
        int done = (MPI_Wtime() - start) * 1e3 >= ms;
        MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (done) return;
    }
}

static double timed(struct bufs *b, int in_place, int iters, int warmup, int alone) {
    for (int i = 0; i < warmup; i++) call(b, in_place);
    MPI_Barrier(MPI_COMM_WORLD);
    double seconds = 0;
    if (alone) {
        for (int i = 0; i < iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double start = MPI_Wtime();
            call(b, in_place);
            seconds += MPI_Wtime() - start;
        }
    } else {
        double start = MPI_Wtime();
        for (int i = 0; i < iters; i++) call(b, in_place);
        seconds = MPI_Wtime() - start;
    }
    double us = seconds * 1e6 / iters, slowest = 0;
    MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (argc < 10) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: %s collective type op root iters warmup settle_ms b2b|alone count...\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }
    coll = lookup(argv[1], COLL_NAMES, 7);
    type = lookup(argv[2], TYPE_NAMES, 9);
    op = lookup(argv[3], OP_NAMES, 4);
    root = atoi(argv[4]);
    int iters = atoi(argv[5]), warmup = atoi(argv[6]), settle_ms = atoi(argv[7]);
    int alone = strcmp(argv[8], "alone") == 0;
    if (coll < 0 || type < 0 || (op < 0 && (coll == ALLREDUCE || coll == REDUCESCATTER ||
                                            coll == REDUCE)) ||
        root < 0 || root >= ranks || ranks > 64) {
        if (rank == 0) fprintf(stderr, "%s: bad collective, type, op, root or rank count\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    if (iters < 1) iters = 1;
    dt = mpi_type(type);
    mop = op == PROD ? MPI_PROD : op == MIN ? MPI_MIN : op == MAX ? MPI_MAX : MPI_SUM;
    for (int a = 9; a < argc; a++) {
        struct bufs b;
        b.c = atol(argv[a]);
        long c = b.c, send_len = c, recv_len = c;
        switch (coll) {
        case ALLGATHER: recv_len = c * ranks; break;
        case REDUCESCATTER: send_len = recv_len = c * ranks; break;
        case ALLTOALL: send_len = recv_len = c * ranks; break;
        case ALLTOALLV:
            send_len = recv_len = 0;
            for (int p = 0; p < ranks; p++) {
                b.scounts[p] = (int)vcount(rank, p, c);
                b.sdispls[p] = (int)send_len;
                send_len += b.scounts[p];
                b.rcounts[p] = (int)vcount(p, rank, c);
                b.rdispls[p] = (int)recv_len;
                recv_len += b.rcounts[p];
            }
            break;
        }
        b.send = malloc((size_t)(send_len + 1) * TYPE_SIZES[type]);
        b.recv = malloc((size_t)(recv_len + 1) * TYPE_SIZES[type]);
        if (!b.send || !b.recv) MPI_Abort(MPI_COMM_WORLD, 1);
        double t[2] = {0, -1};
        long wrong = 0;
        for (int in_place = 0; in_place < (coll == ALLTOALLV ? 1 : 2); in_place++) {
            reset(&b, in_place, send_len, recv_len);
            call(&b, in_place);
            wrong += check(&b);
            if (a == 9 && !in_place) settle(&b, settle_ms);
            t[in_place] = timed(&b, in_place, iters, warmup, alone);
        }
        long all_wrong = 0;
        MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            if (t[1] < 0)
                printf("%ld %.3f - %ld\n", c, t[0], all_wrong);
            else
                printf("%ld %.3f %.3f %ld\n", c, t[0], t[1], all_wrong);
            fflush(stdout);
        }
        free(b.send);
        free(b.recv);
    }
    MPI_Finalize();
    return 0;
}
