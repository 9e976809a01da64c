/*
 * tinyacc.h: the C ABI of tinyacc, a training engine for GPT models.
 *
 * Build the library with
 *     go build -buildmode=c-shared -o build/libtinyacc.so ./capi
 * and link with -Lbuild -ltinyacc (or load it with dlopen).
 *
 * Conventions
 *   - Objects are opaque int64 handles (tinyacc_handle). 0 is never a valid
 *     handle; it means "none" where an argument is optional. Handles are
 *     never reused: a freed handle stays invalid, and using one is an error
 *     status (TINYACC_ERR_HANDLE), never a crash.
 *   - Caller buffers are passed as pointer + element count and are read or
 *     written only during the call, except registered buffers (below),
 *     which the library may use until their handle is freed.
 *   - Every function except the three string/int getters returns a status:
 *     TINYACC_OK (0) or a negative TINYACC_ERR_* kind. tinyacc_last_error()
 *     then returns the message of the last failure on the calling thread.
 *   - Output pointers marked "optional" may be NULL.
 *   - Calls on one session are serialised; collectives are process-wide.
 */
#ifndef TINYACC_H
#define TINYACC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature or the meaning of a status changes. */
#define TINYACC_ABI_VERSION 5

typedef int64_t tinyacc_handle;

/* Status codes. */
#define TINYACC_OK 0
#define TINYACC_ERR_ARG (-1)          /* NULL pointer, negative count, bad enum value */
#define TINYACC_ERR_HANDLE (-2)       /* unknown, freed, or of the wrong kind */
#define TINYACC_ERR_CONFIG (-3)       /* invalid configuration; the message names the key */
#define TINYACC_ERR_SIZE (-4)         /* a buffer does not match the expected size */
#define TINYACC_ERR_IO (-5)           /* reading or writing a file failed */
#define TINYACC_ERR_STATE (-6)        /* call out of order (backward twice, step without backward) */
#define TINYACC_ERR_COMM (-7)         /* a collective or the process group failed */
#define TINYACC_ERR_RUNTIME (-8)      /* the engine reported an error */
#define TINYACC_ERR_UNSUPPORTED (-9)  /* valid but not implemented yet */
#define TINYACC_ERR_INTERNAL (-10)    /* a bug inside tinyacc (a recovered panic) */

/* Reduction operations of the collectives. */
#define TINYACC_SUM 0
#define TINYACC_AVG 1
#define TINYACC_MAX 2
#define TINYACC_MIN 3

/* tinyacc_metrics fills this many doubles, in this order. The step is the
 * number of optimizer steps completed, from 1 (ABI version 3; 0-based before). */
#define TINYACC_NUM_METRICS 7
#define TINYACC_METRIC_STEP 0
#define TINYACC_METRIC_LOSS 1
#define TINYACC_METRIC_LR 2
#define TINYACC_METRIC_GRAD_NORM 3
#define TINYACC_METRIC_TOKENS_PER_S 4
#define TINYACC_METRIC_STEP_MS 5
#define TINYACC_METRIC_MFU 6

/* ---- Library ---------------------------------------------------------- */

/* The release, e.g. "0.1.0". The string is static. */
const char *tinyacc_version(void);

/* TINYACC_ABI_VERSION of the library; compare with the header's. */
int tinyacc_abi_version(void);

/* The message of the last failed call on this thread ("" if none). Valid
 * until the next failing call on the same thread. */
const char *tinyacc_last_error(void);

/* Drops a handle of any kind. Objects still used by others stay alive
 * (a model freed after tinyacc_prepare keeps training in its session). */
int tinyacc_free(tinyacc_handle handle);

/* ---- Configuration ---------------------------------------------------- */

/* A config from the built-in defaults, YAML or JSON text (text starting
 * with '{' is JSON; "" or NULL for none), then TINYACC_* environment
 * variables, as `tinyacc train` lays a file under the environment. Unknown
 * keys, unknown TINYACC_* variables and invalid values fail with
 * TINYACC_ERR_CONFIG and a message naming the key or variable. */
int tinyacc_config_new(const char *text, tinyacc_handle *config);

/* The config `tinyacc train` would use, without flags: the defaults, the
 * YAML file (NULL or "" for none), then TINYACC_* environment variables
 * (TINYACC_TRAIN__LR=1e-3 sets train.lr). */
int tinyacc_config_from_env(const char *file, tinyacc_handle *config);

/* Every layer of `tinyacc train`: the defaults, a YAML file or YAML/JSON
 * text (NULL or "" for none; not both), TINYACC_* environment variables,
 * then flags, one "--key=value" per line of args (NULL or "" for none):
 * the explicit arguments of a binding, which win over the rest. */
int tinyacc_config_resolve(const char *file, const char *text, const char *args, tinyacc_handle *config);

/* Every key of a config as nested JSON, NUL-terminated, into buf (cap
 * bytes). *need (optional) receives the size needed including the NUL;
 * call with buf NULL and cap 0 to ask for it. */
int tinyacc_config_json(tinyacc_handle config, char *buf, int64_t cap, int64_t *need);

/* One key of a config ("train.steps", "train.schedule") as text, as
 * `tinyacc config show` prints it without a string's quotes ("300",
 * "cosine", "0.0003", "30s"), NUL-terminated into buf; cap and *need as for
 * tinyacc_config_json. An unknown key fails with TINYACC_ERR_CONFIG.
 * (Added in ABI version 4 without a bump: nothing existing changed.) */
int tinyacc_config_get(tinyacc_handle config, const char *key, char *buf, int64_t cap, int64_t *need);

/* One integer key of a config (train.steps, model.n_layer, ...) into
 * *value; a key that is not an integer fails with TINYACC_ERR_CONFIG. */
int tinyacc_config_get_int(tinyacc_handle config, const char *key, int64_t *value);

/* ---- Model ------------------------------------------------------------ */

/* A GPT-2 model with the config's model.* shape, initialised from
 * train.seed (or loaded from init_from when set, whose file is checked
 * here). The model is only described until tinyacc_prepare places it: each
 * rank then allocates and fills only the parts its layout gives it (and its
 * optimizer state only for those), reading init_from or a file loaded
 * before prepare by byte range. Reading or setting a parameter, saving or
 * generating before prepare builds the whole model on this rank first. */
int tinyacc_model_new(tinyacc_handle config, tinyacc_handle *model);

/* Writes the weights as safetensors under Hugging Face GPT-2 names. Once
 * the model is prepared in a data-parallel session, every rank must call
 * it (ZeRO-3 gathers its shards) and rank 0 writes the file. */
int tinyacc_model_save(tinyacc_handle model, const char *path);

/* Reads weights from safetensors (tinyacc or Hugging Face GPT-2 files).
 * Once the model is prepared in a session, each rank reads only the byte
 * ranges of the parts it holds (ZeRO-3's shards included); before, the file
 * is checked and prepare fills the model from it the same way. */
int tinyacc_model_load(tinyacc_handle model, const char *path);

/* Number of parameter tensors. */
int tinyacc_param_count(tinyacc_handle model, int64_t *count);

/* Name of parameter index (0 <= index < count), NUL-terminated, into buf;
 * *need (optional) as for tinyacc_config_json. */
int tinyacc_param_name(tinyacc_handle model, int64_t index, char *buf, int64_t cap, int64_t *need);

/* Shape of a parameter: its dimensions into dims (cap entries), the number
 * of dimensions into *ndim (optional). */
int tinyacc_param_shape(tinyacc_handle model, const char *name, int64_t *dims, int64_t cap, int64_t *ndim);

/* Copies a parameter into out; n must equal its number of elements. */
int tinyacc_param_get(tinyacc_handle model, const char *name, float *out, int64_t n);

/* Overwrites a parameter from in; n must equal its number of elements. */
int tinyacc_param_set(tinyacc_handle model, const char *name, const float *in, int64_t n);

/* Copies a parameter's accumulated gradient into out (zeros before the
 * first backward); n must equal its number of elements. */
int tinyacc_grad_get(tinyacc_handle model, const char *name, float *out, int64_t n);

/* Samples n_new tokens after the prompt into out (n_new entries):
 * temperature 0 is greedy, top_k 0 keeps every token. */
int tinyacc_generate(tinyacc_handle model, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                     double temperature, int64_t top_k, int64_t seed, int32_t *out);

/* ---- Optimizer -------------------------------------------------------- */

/* The optimizer the config selects (train.optimizer: adamw or sgd, with
 * its hyper-parameters) over the model's parameters. */
int tinyacc_optimizer_new(tinyacc_handle config, tinyacc_handle model, tinyacc_handle *optimizer);

/* Writes / reads the optimizer's buffers (AdamW moments) and per-parameter
 * step counts ("step.<name>", which AdamW's bias correction needs to
 * resume exactly) as safetensors. After tinyacc_prepare of a ZeRO session
 * each rank saves and loads only its own shard, so each rank needs its own
 * file. */
int tinyacc_optimizer_save(tinyacc_handle optimizer, const char *path);
int tinyacc_optimizer_load(tinyacc_handle optimizer, const char *path);

/* ---- Data ------------------------------------------------------------- */

/* A loader over the config's corpus: data.path, or the Go toolchain's own
 * sources when it is "". Split into training and validation data by
 * data.val_fraction, cut into model.block_size windows. */
int tinyacc_loader_new(tinyacc_handle config, tinyacc_handle *loader);

/* Batch size B, window length T, micro-batches per step A and training
 * tokens (each optional). */
int tinyacc_loader_info(tinyacc_handle loader, int64_t *batch, int64_t *seq, int64_t *accum, int64_t *tokens);

/* Fills x (inputs) and y (next-token targets), n = B*T tokens each, with
 * micro-batch micro (0 <= micro < A) of optimizer step step: the exact
 * batch `tinyacc train` uses there. Once the loader is prepared in a
 * data-parallel session it returns this rank's slice of the global batch
 * (B sequences of B*ranks). */
int tinyacc_loader_batch(tinyacc_handle loader, int64_t step, int64_t micro, int32_t *x, int32_t *y, int64_t n);

/* ---- Training session ------------------------------------------------- */

/* Joins a config, a model, an optimizer and a loader (both optional: 0)
 * into a session. The config drives the step: learning-rate schedule,
 * clipping (train.grad_clip), train.grad_accum, batch size; the model and
 * loader must have the config's shapes. Under a launcher (WORLD_SIZE > 1)
 * a session with an optimizer is data-parallel over the world: DDP or ZeRO
 * as zero.stage and ddp.mode select, train.batch_size sequences per rank,
 * gradients averaged, every rank prepares it in the same order. */
int tinyacc_prepare(tinyacc_handle config, tinyacc_handle model, tinyacc_handle optimizer,
                    tinyacc_handle loader, tinyacc_handle *session);

/* Forward pass on batch*seq tokens (x inputs, y targets, 1 <= seq <=
 * model.block_size); *value (optional) receives the mean loss. With loss
 * non-NULL the graph is kept for tinyacc_backward under a new loss handle
 * (free it when done); with loss NULL it is freed at once (evaluation). */
int tinyacc_forward(tinyacc_handle session, const int32_t *x, const int32_t *y, int64_t batch, int64_t seq,
                    tinyacc_handle *loss, double *value);

/* The mean loss a forward pass computed. */
int tinyacc_loss_value(tinyacc_handle loss, double *value);

/* Accumulates the loss's gradients, scaled by 1/train.grad_accum, and frees
 * its graph. A loss can be backpropagated once. */
int tinyacc_backward(tinyacc_handle loss);

/* Optimizer step once train.grad_accum backward passes are accumulated:
 * clip, update, zero the gradients; *stepped (optional) is 1 then, 0 while
 * still accumulating. */
int tinyacc_step(tinyacc_handle session, int32_t *stepped);

/* Clears the gradients, except while a step is being accumulated. */
int tinyacc_zero_grad(tinyacc_handle session);

/* A whole optimizer step on caller data: n = A*B*T tokens, the step's
 * micro-batches in order; *loss (optional) is the step's mean loss. */
int tinyacc_train_step(tinyacc_handle session, const int32_t *x, const int32_t *y, int64_t n, double *loss);

/* The next optimizer step on the session's loader, as `tinyacc train` runs
 * it; *loss (optional) is the step's mean loss. */
int tinyacc_run_step(tinyacc_handle session, double *loss);

/* Mean validation loss over train.eval_batches batches of the step's
 * global size, which the ranks split as they split a step's batch: every
 * rank calls it, and all get the same value. */
int tinyacc_evaluate(tinyacc_handle session, double *loss);

/* Scales the accumulated gradients to global norm <= max_norm (0 only
 * measures); *norm (optional) receives the norm before. Not available in a
 * data-parallel session (TINYACC_ERR_UNSUPPORTED): use train.grad_clip. */
int tinyacc_clip_grad_norm(tinyacc_handle session, double max_norm, double *norm);

/* The last optimizer step's metrics into out (n = TINYACC_NUM_METRICS). */
int tinyacc_metrics(tinyacc_handle session, double *out, int64_t n);

/* Index of the next optimizer step and backward passes pending (optional). */
int tinyacc_session_state(tinyacc_handle session, int64_t *step, int64_t *micro);

/* Continues at optimizer step step (after loading a checkpoint). */
int tinyacc_set_step(tinyacc_handle session, int64_t step);

/* Writes the session's whole training state (model, optimizer state with
 * its step counts, the step) as a checkpoint dir/step-NNNNNNN and points
 * dir/latest at it. Every rank of a data-parallel session must call it;
 * each writes only what it owns, and any layout can load the result. */
int tinyacc_save_checkpoint(tinyacc_handle session, const char *dir);

/* Loads the checkpoint at dir (a step-NNNNNNN directory, or a directory
 * whose latest pointer names one) into the session, whatever number of
 * ranks or ZeRO stage wrote it, and continues at its step; *step
 * (optional) receives it. Every rank must call it; nothing changes unless
 * the whole checkpoint fits the session. */
int tinyacc_load_checkpoint(tinyacc_handle session, const char *dir, int64_t *step);

/* ---- Collectives over the world group ---------------------------------- */
/* The world group comes from the launcher's environment (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, as set by `tinyacc launch`); without one the
 * process is a world of one. It is joined on the first call; every rank
 * must issue the same collectives in the same order. */

/* Joins the world group (once) and returns this rank and the world size
 * (both optional). */
int tinyacc_dist_init(int64_t *rank, int64_t *size);

/* As tinyacc_dist_init, with the deadline of config's comm.timeout for
 * every collective and barrier of the world group (tinyacc_dist_init reads
 * it from the TINYACC_* environment). A group already joined keeps the
 * deadline it was joined with. */
int tinyacc_dist_init_config(tinyacc_handle config, int64_t *rank, int64_t *size);

/* Leaves the world group; a later collective joins again. */
int tinyacc_dist_finalize(void);

/* Reduces buf (n floats) over all ranks in place with op (TINYACC_SUM...). */
int tinyacc_all_reduce(float *buf, int64_t n, int32_t op);

/* Concatenates every rank's in (n floats) into out (out_n = size*n), in
 * rank order. */
int tinyacc_all_gather(const float *in, int64_t n, float *out, int64_t out_n);

/* Reduces in (in_n = size*out_n floats) over all ranks with op and leaves
 * this rank's block in out. */
int tinyacc_reduce_scatter(const float *in, int64_t in_n, float *out, int64_t out_n, int32_t op);

/* As tinyacc_reduce_scatter, started on a library thread: returns at once
 * with a handle for tinyacc_collective_wait (ABI version 5). Started
 * collectives run one at a time in the order they were started; in and out
 * are borrowed until the wait returns. Wait for every started collective
 * before calling a blocking one (all ranks must issue them in the same
 * order). */
int tinyacc_reduce_scatter_start(const float *in, int64_t in_n, float *out, int64_t out_n, int32_t op, tinyacc_handle *pending);

/* tinyacc_reduce_scatter and tinyacc_reduce_scatter_start with the wire in
 * dtype ("fp32" or "bf16", the values of ddp.reduce_dtype). Under "bf16"
 * in is rounded to bfloat16, the ranks' blocks are summed in float32 and
 * rounded once, and out receives this rank's bfloat16 block widened to
 * float32: half the bytes sent. (Added in ABI version 5 without a bump:
 * nothing existing changed.) */
int tinyacc_reduce_scatter_as(const float *in, int64_t in_n, float *out, int64_t out_n, int32_t op, const char *dtype);
int tinyacc_reduce_scatter_start_as(const float *in, int64_t in_n, float *out, int64_t out_n, int32_t op, const char *dtype, tinyacc_handle *pending);

/* Blocks until the started collective `pending` has finished (each is
 * bounded by the world group's deadline), frees the handle and returns the
 * collective's status. */
int tinyacc_collective_wait(tinyacc_handle pending);

/* Copies rank root's buf (n floats) into buf on every rank. */
int tinyacc_broadcast(float *buf, int64_t n, int32_t root);

/* Returns once every rank has entered it. */
int tinyacc_barrier(void);

/* The payload bytes this rank has sent since it joined the world group, on
 * it and on every group made from it (the reducer's and started
 * collectives included), counted as the algorithms move the data: a ring
 * all-reduce of n bytes over N ranks sends 2(N-1)/N n (a direct one
 * (N-1) n), an all-gather of n bytes per rank (N-1) n, a reduce-scatter of
 * N n bytes (N-1) n (docs/formulas.md). Fails with TINYACC_ERR_UNSUPPORTED
 * on a backend that does not count. */
int tinyacc_comm_sent_bytes(int64_t *sent);

/* ---- Registered buffers and the bucketed gradient reducer -------------- */
/* For frameworks that compute gradients themselves (ABI version 4). The
 * caller lays its gradients out in float32 buckets it owns and registers
 * each bucket once; the library reads and writes that memory in place,
 * from its own thread, until the buffer's handle is freed (tinyacc_free
 * waits for an all-reduce still using it). The library never hands its
 * own memory to the caller. */

/* Registers data (n floats, n > 0), owned by the caller and kept valid by
 * it until tinyacc_free(*out). */
int tinyacc_buffer_register(float *data, int64_t n, tinyacc_handle *out);

/* A reducer over n registered buffers (bucket i is buffers[i]) on the world
 * group: each round averages every bucket over the ranks. timeout_s (> 0,
 * comm.timeout) bounds tinyacc_buckets_wait; traced != 0 records a span per
 * bucket for tinyacc_reducer_trace. */
int tinyacc_reducer_new(const tinyacc_handle *buffers, int64_t n, double timeout_s, int32_t traced, tinyacc_handle *out);

/* The dtype the reducer averages buckets in (ddp.reduce_dtype): "fp32"
 * (the default) or "bf16": each float32 bucket is rounded to bfloat16,
 * all-reduced (summed in float32 and rounded once) and widened back in
 * place, half the bytes. Call before the first bucket_ready. */
int tinyacc_reducer_reduce_dtype(tinyacc_handle reducer, const char *dtype);

/* Bucket `bucket`'s gradients are final on this rank: its all-reduce (an
 * average over the ranks) starts on a library thread as soon as every
 * bucket before it is ready too (so all ranks issue them in the same
 * order), and this call returns at once. Each bucket at most once per
 * round. */
int tinyacc_bucket_ready(tinyacc_handle reducer, int64_t bucket);

/* Starts the buckets not announced this round (their memory reduced as it
 * is), blocks until every all-reduce of the round is done, and begins the
 * next round. After timeout_s it fails with TINYACC_ERR_COMM naming the
 * rank and the unfinished buckets, and the reducer stays unusable. */
int tinyacc_buckets_wait(tinyacc_handle reducer);

/* Writes the reducer's spans (bucket ready, all-reduce bucket i, buckets
 * wait) as a Chrome trace to path. */
int tinyacc_reducer_trace(tinyacc_handle reducer, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* TINYACC_H */
