/*
 * MPI_Allreduce baseline for kolo-bench: in place, f32 sum, over the same
 * geometric size sweep and with the same timing as `kolo-bench --op
 * allreduce` (per iteration: restore the input, barrier, time the call;
 * report the median over iterations of the slowest rank's time) and the
 * same columns, so the two tables compare line by line.
 *
 *   mpicc -O2 -o allreduce allreduce.c
 *   mpirun -np 2 ./allreduce [min_bytes] [max_bytes] [factor] [iters] [warmup]
 *
 * Sizes accept the K/M/G suffixes of kolo-bench (8, 64K, 16M, 1G).
 * Defaults: 8 64M 2 20 5.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses "64K"-style sizes; exits with a message naming the text if bad. */
static size_t parse_size(const char *text, int rank) {
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    size_t mult = 1;
    if (end == text) goto bad;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: goto bad;
    }
    if (*end != '\0') goto bad;
    return (size_t)value * mult;
bad:
    if (rank == 0) fprintf(stderr, "allreduce: invalid size \"%s\" (e.g. 8, 64K, 16M, 1G)\n", text);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 0;
}

/* The inputs kolo-bench uses for sums: small integers, exact in f32. */
static float input(int rank, size_t i) { return (float)((rank * 7 + i * 3) % 4); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    size_t min_bytes = argc > 1 ? parse_size(argv[1], rank) : 8;
    size_t max_bytes = argc > 2 ? parse_size(argv[2], rank) : 64u << 20;
    size_t factor = argc > 3 ? parse_size(argv[3], rank) : 2;
    int iters = argc > 4 ? atoi(argv[4]) : 20;
    int warmup = argc > 5 ? atoi(argv[5]) : 5;
    if (min_bytes < 1 || min_bytes > max_bytes || factor < 2 || iters < 1 || warmup < 0) {
        if (rank == 0)
            fprintf(stderr, "allreduce: need 1 <= min (%zu) <= max (%zu), factor (%zu) >= 2, iters (%d) >= 1, warmup (%d) >= 0\n",
                    min_bytes, max_bytes, factor, iters, warmup);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    size_t max_count = max_bytes / sizeof(float) ? max_bytes / sizeof(float) : 1;
    float *pristine = malloc(max_count * sizeof(float));
    float *buf = malloc(max_count * sizeof(float));
    double *times = malloc((size_t)iters * sizeof(double));
    double *slowest = malloc((size_t)iters * sizeof(double));
    if (!pristine || !buf || !times || !slowest) {
        fprintf(stderr, "allreduce: rank %d cannot allocate %zu bytes\n", rank, 2 * max_count * sizeof(float));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < max_count; i++) pristine[i] = input(rank, i);

    if (rank == 0) {
        printf("# allreduce: mpi (MPI_Allreduce, in place), %d ranks\n", size);
        printf("#%11s %13s %6s %7s %11s %8s %8s %7s\n", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong");
        printf("#%11s %13s %6s %7s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    double busbw_factor = 2.0 * (size - 1) / size;
    unsigned long long total_wrong = 0;
    size_t prev_count = 0;
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
        size_t count = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
        if (count != prev_count) {
            prev_count = count;
            for (int it = 0; it < warmup + iters; it++) {
                memcpy(buf, pristine, count * sizeof(float));
                if (it == warmup) MPI_Barrier(MPI_COMM_WORLD);
                double start = MPI_Wtime();
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double elapsed = MPI_Wtime() - start;
                if (it >= warmup) times[it - warmup] = elapsed * 1e6;
            }
            unsigned long long wrong = 0;
            for (size_t i = 0; i < count; i++) {
                float expected = 0.0f;
                for (int r = 0; r < size; r++) expected += input(r, i);
                wrong += buf[i] != expected;
            }
            unsigned long long all_wrong = 0;
            MPI_Reduce(times, slowest, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            MPI_Reduce(&wrong, &all_wrong, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                double time_us = median(slowest, iters);
                size_t real_bytes = count * sizeof(float);
                double algbw = time_us > 0 ? (double)real_bytes / time_us / 1e3 : 0.0;
                printf("%12zu %13zu %6s %7s %11.2f %8.3f %8.3f %7llu\n", real_bytes, count, "f32", "sum",
                       time_us, algbw, algbw * busbw_factor, all_wrong);
                fflush(stdout);
                total_wrong += all_wrong;
            }
        }
        if (bytes > max_bytes / factor) break; /* the next step would overflow or pass max */
    }
    if (rank == 0) printf("# Out of bounds values : %llu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");

    free(pristine);
    free(buf);
    free(times);
    free(slowest);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
