/*
 * kolo from C: a few steps of data-parallel training, the way a framework
 * binding drives kolo — gradients reduced through handles and callbacks,
 * a grouped allreduce, the other collectives, and the errors a mismatch
 * and bad input give. Every process of the job runs it:
 *
 *   cc -o train examples/train.c -Iinclude -L../../target/debug -lkolo_capi
 *   kolo-run -n 3 ./train
 *
 * Prints "rank R of N: ok" and exits 0 when every check held; otherwise
 * names the check and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo.h"

static int rank, size;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "rank %d: check failed: ", rank);       \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, " (last error: %s)\n", kolo_last_error()); \
      exit(1);                                                \
    }                                                         \
  } while (0)

static void sleep_ms(void) {
  struct timespec ms = {0, 1000000};
  nanosleep(&ms, NULL);
}

static kolo_tensor host_tensor(void *data, int32_t dtype, int32_t ndim, const int64_t *shape) {
  kolo_tensor t = {data, dtype, ndim, shape, KOLO_CPU};
  return t;
}

/* What a completion callback saw (on kolo's callback thread): `calls`
 * is stored last, so a reader that sees it sees the rest. */
struct seen {
  atomic_int calls;
  int status;
  int64_t rows;
};

static void on_done(int64_t handle, int32_t status, void *user) {
  struct seen *seen = user;
  kolo_tensor out;
  seen->status = status;
  if (status == KOLO_OK && kolo_output(handle, &out) == KOLO_OK) seen->rows = out.shape[0];
  atomic_fetch_add(&seen->calls, 1);
}

int main(void) {
  CHECK(kolo_rank() == -1 && kolo_size() == -1, "queries are -1 before kolo_init");
  CHECK(kolo_init() == KOLO_OK, "kolo_init");
  rank = kolo_rank();
  size = kolo_size();
  CHECK(size >= 1 && rank >= 0 && rank < size, "rank %d of %d", rank, size);
  CHECK(kolo_local_rank() >= 0 && kolo_local_size() >= 1, "local rank and size");
  CHECK(kolo_mpi_threads_supported() >= 0, "kolo_mpi_threads_supported after init");

  /* A few steps: two gradients averaged through handles. */
  enum { N = 1000 };
  static float w[N], b[10];
  const int64_t w_shape[] = {N}, b_shape[] = {2, 5};
  for (int step = 0; step < 3; step++) {
    for (int i = 0; i < N; i++) w[i] = (float)(rank + step);
    for (int i = 0; i < 10; i++) b[i] = (float)rank;
    kolo_tensor tw = host_tensor(w, KOLO_FLOAT32, 1, w_shape);
    kolo_tensor tb = host_tensor(b, KOLO_FLOAT32, 2, b_shape);
    int64_t hw, hb;
    CHECK(kolo_allreduce("grad/w", &tw, KOLO_AVERAGE, 1.0, 1.0, NULL, NULL, NULL, &hw) == KOLO_OK,
          "enqueue grad/w");
    CHECK(kolo_allreduce("grad/b", &tb, KOLO_SUM, 1.0, 1.0, NULL, NULL, NULL, &hb) == KOLO_OK,
          "enqueue grad/b");
    int polled = kolo_poll(hw);
    CHECK(polled == KOLO_OK || polled == KOLO_IN_PROGRESS, "poll grad/w: %d", polled);
    CHECK(kolo_wait(hw, 60.0) == KOLO_OK, "wait grad/w");
    CHECK(kolo_wait(hb, -1.0) == KOLO_OK, "wait grad/b");
    CHECK(kolo_release(hw) == KOLO_OK && kolo_release(hb) == KOLO_OK, "release");
    float mean = (float)(size - 1) / 2.0f + (float)step;
    CHECK(w[0] == mean && w[N - 1] == mean, "grad/w = %f, expected %f", w[0], mean);
    CHECK(b[9] == (float)(size * (size - 1) / 2), "grad/b = %f", b[9]);
  }
  CHECK(kolo_poll(12345678) == KOLO_ERR_UNKNOWN_HANDLE, "an unknown handle is an error");

  /* A grouped allreduce of i64 tensors, reported to a callback. */
  int64_t g0[4], g1[3];
  for (int i = 0; i < 4; i++) g0[i] = rank + 1;
  for (int i = 0; i < 3; i++) g1[i] = 10 * (rank + 1);
  const int64_t s4[] = {4}, s3[] = {3};
  kolo_tensor group[2] = {host_tensor(g0, KOLO_INT64, 1, s4), host_tensor(g1, KOLO_INT64, 1, s3)};
  const char *names[2] = {"group/a", "group/b"};
  int64_t hg;
  CHECK(kolo_grouped_allreduce(names, group, 2, KOLO_MAX, 1.0, 1.0, NULL, NULL, NULL, &hg) == KOLO_OK,
        "enqueue the group");
  CHECK(kolo_wait(hg, 60.0) == KOLO_OK && kolo_release(hg) == KOLO_OK, "wait for the group");
  CHECK(g0[3] == size && g1[0] == 10 * size, "group max: %lld %lld", (long long)g0[3], (long long)g1[0]);

  /* Broadcast from the last rank, with a callback. */
  double weights[6];
  for (int i = 0; i < 6; i++) weights[i] = rank * 100.0 + i;
  const int64_t s23[] = {2, 3};
  kolo_tensor tweights = host_tensor(weights, KOLO_FLOAT64, 2, s23);
  struct seen bseen = {0, 0, 0};
  CHECK(kolo_broadcast("weights", &tweights, size - 1, NULL, on_done, &bseen, NULL) == KOLO_OK,
        "enqueue the broadcast");
  for (int i = 0; i < 60000 && atomic_load(&bseen.calls) == 0; i++) sleep_ms();
  CHECK(atomic_load(&bseen.calls) == 1 && bseen.status == KOLO_OK, "the broadcast's callback");
  CHECK(weights[5] == (size - 1) * 100.0 + 5, "broadcast: %f", weights[5]);

  /* Allgather rows of a per-rank length, read in a callback. */
  int32_t rows[8];
  for (int i = 0; i < 2 * (rank + 1); i++) rows[i] = rank;
  const int64_t rshape[] = {rank + 1, 2};
  kolo_tensor trows = host_tensor(rows, KOLO_INT32, 2, rshape);
  struct seen gseen = {0, 0, 0};
  CHECK(kolo_allgather("rows", &trows, NULL, on_done, &gseen, NULL) == KOLO_OK, "enqueue the allgather");
  for (int i = 0; i < 60000 && atomic_load(&gseen.calls) == 0; i++) sleep_ms();
  CHECK(atomic_load(&gseen.calls) == 1 && gseen.rows == size * (size + 1) / 2, "allgather rows: %lld",
        (long long)gseen.rows);

  /* Reduce-scatter: each rank keeps its share of 2 * size rows. */
  int32_t full[64], mine[2];
  for (int i = 0; i < 2 * size; i++) full[i] = i;
  const int64_t fshape[] = {2 * size}, mshape[] = {2};
  kolo_tensor tfull = host_tensor(full, KOLO_INT32, 1, fshape);
  kolo_tensor tmine = host_tensor(mine, KOLO_INT32, 1, mshape);
  int64_t hrs;
  CHECK(kolo_reduce_scatter("rs", &tfull, &tmine, KOLO_SUM, 1.0, 1.0, NULL, NULL, NULL, &hrs) == KOLO_OK,
        "enqueue the reduce-scatter");
  CHECK(kolo_wait(hrs, 60.0) == KOLO_OK && kolo_release(hrs) == KOLO_OK, "wait for the reduce-scatter");
  CHECK(mine[0] == 2 * rank * size && mine[1] == (2 * rank + 1) * size, "reduce-scatter: %d %d", mine[0],
        mine[1]);

  /* Alltoall: one row to every rank. */
  uint8_t send[64];
  for (int i = 0; i < size; i++) send[i] = (uint8_t)(rank * 10 + i);
  const int64_t sshape[] = {size};
  kolo_tensor tsend = host_tensor(send, KOLO_UINT8, 1, sshape);
  int64_t ha;
  CHECK(kolo_alltoall("a2a", &tsend, NULL, 0, NULL, NULL, NULL, &ha) == KOLO_OK, "enqueue the alltoall");
  CHECK(kolo_wait(ha, 60.0) == KOLO_OK, "wait for the alltoall");
  kolo_tensor got;
  const int64_t *splits;
  int32_t nsplits;
  CHECK(kolo_output(ha, &got) == KOLO_OK && kolo_output_splits(ha, &splits, &nsplits) == KOLO_OK,
        "the alltoall's output");
  CHECK(got.dtype == KOLO_UINT8 && got.ndim == 1 && got.shape[0] == size && nsplits == size, "alltoall shape");
  for (int p = 0; p < size; p++)
    CHECK(((uint8_t *)got.data)[p] == p * 10 + rank && splits[p] == 1, "alltoall from rank %d", p);
  CHECK(kolo_release(ha) == KOLO_OK, "release the alltoall");

  /* A mismatch fails on every rank, naming the tensor and both shapes... */
  float odd[8];
  const int64_t oshape[] = {4 + (rank % 2)};
  kolo_tensor todd = host_tensor(odd, KOLO_FLOAT32, 1, oshape);
  int64_t hm;
  CHECK(kolo_allreduce("mismatched", &todd, KOLO_SUM, 1.0, 1.0, NULL, NULL, NULL, &hm) == KOLO_OK,
        "enqueue the mismatch");
  if (size > 1) {
    CHECK(kolo_wait(hm, 60.0) == KOLO_ERR_MISMATCH, "a mismatch fails");
    const char *why = kolo_last_error();
    CHECK(strstr(why, "mismatched") && strstr(why, "[4]") && strstr(why, "[5]"), "the message: %s", why);
    CHECK(strcmp(kolo_handle_error(hm), why) == 0, "the handle keeps the message");
  } else {
    CHECK(kolo_wait(hm, 60.0) == KOLO_OK, "alone, nothing mismatches");
  }
  kolo_release(hm);

  /* ... and bad input is refused before anything is submitted. */
  const int64_t negative[] = {2, -3};
  kolo_tensor bad = host_tensor(odd, KOLO_FLOAT32, 2, negative);
  int64_t h;
  CHECK(kolo_allreduce("bad", &bad, KOLO_SUM, 1, 1, NULL, NULL, NULL, &h) == KOLO_ERR_INVALID_ARGUMENT &&
            strstr(kolo_last_error(), "negative"),
        "a negative dimension");
  bad = host_tensor(odd, 99, 1, oshape);
  CHECK(kolo_allreduce("bad", &bad, KOLO_SUM, 1, 1, NULL, NULL, NULL, &h) == KOLO_ERR_INVALID_ARGUMENT &&
            strstr(kolo_last_error(), "unknown data type 99"),
        "an unknown data type");
  bad = host_tensor(NULL, KOLO_FLOAT32, 1, oshape);
  CHECK(kolo_allreduce("bad", &bad, KOLO_SUM, 1, 1, NULL, NULL, NULL, &h) == KOLO_ERR_INVALID_ARGUMENT &&
            strstr(kolo_last_error(), "null"),
        "a null data pointer");
  CHECK(kolo_allreduce(NULL, &todd, KOLO_SUM, 1, 1, NULL, NULL, NULL, &h) == KOLO_ERR_INVALID_ARGUMENT,
        "a null name");
  CHECK(kolo_allreduce("bad", NULL, KOLO_SUM, 1, 1, NULL, NULL, NULL, &h) == KOLO_ERR_INVALID_ARGUMENT,
        "a null descriptor");
  CHECK(kolo_allreduce("bad", &todd, 17, 1, 1, NULL, NULL, NULL, &h) == KOLO_ERR_INVALID_ARGUMENT,
        "an unknown op");
  CHECK(kolo_allreduce("bad", &todd, KOLO_SUM, 1, 1, NULL, NULL, NULL, NULL) == KOLO_ERR_INVALID_ARGUMENT,
        "neither a callback nor a handle");

  /* The engine still works after all that. */
  float last[1] = {1.0f};
  const int64_t one[] = {1};
  kolo_tensor tlast = host_tensor(last, KOLO_FLOAT32, 1, one);
  CHECK(kolo_allreduce("last", &tlast, KOLO_SUM, 1.0, 1.0, NULL, NULL, NULL, &h) == KOLO_OK &&
            kolo_wait(h, 60.0) == KOLO_OK && last[0] == (float)size,
        "an allreduce after the errors");
  kolo_release(h);

  uint64_t freed = 1;
  CHECK(kolo_release_buffers(&freed) == KOLO_OK && kolo_release_buffers(&freed) == KOLO_OK &&
            freed == 0,
        "kolo_release_buffers, twice");

  int32_t joined = -1;
  CHECK(kolo_join(&joined) == KOLO_OK && joined >= 0 && joined < size, "join");
  CHECK(kolo_shutdown() == KOLO_OK, "kolo_shutdown");
  CHECK(kolo_rank() == -1, "queries are -1 after kolo_shutdown");
  printf("rank %d of %d: ok\n", rank, size);
  return 0;
}
