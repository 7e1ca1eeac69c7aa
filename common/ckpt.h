/*
 * ckpt: the on-disk checkpoint of a run's training state, its writers and its readers.
 *
 * A checkpoint of version s (the state after s optimizer steps) is one directory
 * DIR/step-%08ld under the checkpoint directory DIR:
 *
 *   DIR/step-00000050/shard-000012.safetensors   one per shard, written by the server that
 *                                                holds the shard (zs_ckpt_write_shard)
 *   DIR/step-00000050/manifest.json              written last, by the coordinator, once every
 *                                                shard file is durable (zs_ckpt_write_manifest)
 *   DIR/latest                                   "step-00000050\n": the newest committed one,
 *                                                replaced atomically (zs_ckpt_set_latest)
 *
 * A shard file is safetensors (common/safetensors.h) with three F32 tensors of shape [len],
 * "param", "exp_avg" and "exp_avg_sq" (the fp32 master weights and AdamW's m and v of the
 * flat-vector range [begin, end)), in that order; its header is padded with spaces so that the
 * data section starts at a 4096-byte boundary; its __metadata__ holds format
 * "zshard-shard", format_version, run, step, shard, begin, end.
 *
 * Invariants:
 *  - Every file is written under a temporary name, fsynced, renamed, and its directory
 *    fsynced: a name that exists holds a complete file.  A failure (a full disk) removes the
 *    temporary file and names the path and the OS's reason.  The exception is a shard file
 *    the NVMe tier wrote in place (zs_ckpt_finish_shard): it is under its name from the start,
 *    and only the manifest's checksums, written after it is durable, make it trusted.
 *  - A checkpoint is valid only when its manifest is: the manifest is the last file written
 *    and carries a checksum of itself; it lists every shard with its file, range, file size
 *    and the XXH3-64 checksums of the file's header and of each of its three tensors.
 *  - A reader verifies every checksum of the bytes it uses before it trusts them: nothing read
 *    from a shard file reaches the caller unless the header and the tensor it came from
 *    matched the manifest.  Refusals are ZS_ERR_FORMAT (corrupt) or ZS_ERR_NOTFOUND (missing)
 *    with a message that names the file and what was wrong.
 * Checksums are for corruption, not for an adversary: XXH3 (libxxhash) runs at memory speed.
 */
#ifndef ZS_CKPT_H
#define ZS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "common/lossscale.h"
#include "common/tensors.h"

#define ZS_CKPT_FORMAT_VERSION 1
/* Where a shard file's data starts (its header, padded): array k (zs_ckpt_array order) of a
 * shard of len floats is at ZS_CKPT_DATA_OFFSET + k * 4 * len. */
#define ZS_CKPT_DATA_OFFSET 4096

/* The three arrays of a shard file, in file order. */
typedef enum { ZS_CKPT_PARAM = 0, ZS_CKPT_EXP_AVG = 1, ZS_CKPT_EXP_AVG_SQ = 2 } zs_ckpt_array;
#define ZS_CKPT_ARRAYS 3

/* What a shard file's writer reports and the manifest records. */
typedef struct {
    int index;                     /* shard index in the run's shard list */
    size_t begin, end;             /* floats of the flat vector */
    char file[64];                 /* name inside the step directory */
    uint64_t bytes;                /* file size */
    uint64_t header_xxh3;          /* of the file's first 8 + H bytes */
    uint64_t xxh3[ZS_CKPT_ARRAYS]; /* of each tensor's data bytes */
} zs_ckpt_shard;

/* Everything about a run that a resume checks and needs, besides the shards. */
typedef struct {
    long step;                   /* version: optimizer steps applied */
    long steps_total;            /* the run's --steps */
    uint64_t run_id;             /* random per run (first start); kept across resumes */
    uint64_t config_fingerprint; /* zs_config_fingerprint: what decides the training bits */
    uint64_t data_fingerprint;   /* zs_dataset.fingerprint */
    uint64_t data_ntokens;
    zs_model_config model;
    size_t total_floats; /* the flat vector */
    size_t shard_floats; /* the shard size of the run that wrote it (informative:
                            a reader copes with any boundaries) */
    int has_scaler;      /* fp16 jobs: the manifest's "loss_scaler" (absent in checkpoints of
                            other jobs, and of every job before fp16 existed) */
    zs_lossscale scaler; /* the loss scaler's state after step `step` */
} zs_ckpt_info;

/* "DIR/step-%08ld" into out (n bytes); the directory is created (mode 0777 & umask) when
 * create is set, and DIR too if it does not exist (one level, not its parents); a new step
 * directory is made durable in DIR.  Fails if the name does not fit or a directory cannot be
 * made. */
zs_err zs_ckpt_step_dir(const char *dir, long step, int create, char *out, size_t n);

/*
 * Writes shard file step_dir/shard-%06d.safetensors for shard `index` = [begin, end) from
 * param, exp_avg and exp_avg_sq (each end - begin floats) at version info->step, durably
 * (see the invariants), computing its checksums on the way; fills *out.  The arrays are only
 * read.  Cost: one pass over 12 bytes per float, in large writes.
 */
zs_err zs_ckpt_write_shard(const char *step_dir, const zs_ckpt_info *info, int index, size_t begin,
                           size_t end, const float *param, const float *exp_avg,
                           const float *exp_avg_sq, zs_ckpt_shard *out);

/* step_dir/shard-%06d.safetensors: where shard index's file goes. */
zs_err zs_ckpt_shard_path(const char *step_dir, int index, char *out, size_t n);

/*
 * Completes shard file zs_ckpt_shard_path(step_dir, index) whose arrays another writer (the
 * NVMe tier, which writes a step's output there instead of writing it twice) put in place at
 * their offsets under that name: writes the header, and the weights from param unless param is
 * NULL (then they are in the file already), cuts the file to its size, and makes it and its
 * directory durable; fills *out with xxh3 (the checksums of the arrays in the file; the
 * weights' is computed here when param is given).  The file is trusted by nobody until the
 * manifest that lists it is written, so writing it under its final name keeps the invariants.
 */
zs_err zs_ckpt_finish_shard(const char *step_dir, const zs_ckpt_info *info, int index, size_t begin,
                            size_t end, const float *param, const uint64_t xxh3[ZS_CKPT_ARRAYS],
                            zs_ckpt_shard *out);

/*
 * Writes step_dir/manifest.json for info, the tensor table tt and shards[0..n) (in vector
 * order, covering [0, info->total_floats) without gap or overlap: checked), durably, with its
 * own checksum.  Does not verify the shard files (their writers reported them).
 */
zs_err zs_ckpt_write_manifest(const char *step_dir, const zs_ckpt_info *info,
                              const zs_tensor_table *tt, const zs_ckpt_shard *shards, int n);

/* Removes what a checkpoint that failed left in step directory DIR/step-%08ld (its manifest
 * first, then its shard files and temporary files) and the directory itself, so that the
 * previous checkpoint stays the newest and the space is free again; also one whose manifest
 * was written but whose commit did not complete (its metrics line failed).  Failures are
 * logged (pruning removes what is left later). */
void zs_ckpt_discard(const char *dir, long step);

/* Points DIR/latest at step directory name (e.g. "step-00000050"), atomically. */
zs_err zs_ckpt_set_latest(const char *dir, const char *name);

/*
 * Removes the step directories of DIR older than `newest` (a committed step) beyond the keep
 * newest valid ones (valid: a manifest that parses and checks), and directories older than
 * `newest` without a valid manifest (abandoned checkpoints).  Never removes `newest` or
 * anything newer (being written).  Failures are logged, not returned: pruning is tidying.
 */
void zs_ckpt_prune(const char *dir, long newest, int keep);

/* An open checkpoint: its manifest, parsed and checked, and how to reach its files. */
typedef struct {
    char step_dir[4096];
    zs_ckpt_info info;
    zs_tensor_table tt; /* from the manifest; equal to zs_tensors_gpt2(&info.model) (checked) */
    zs_ckpt_shard *shards;
    int n_shards;
} zs_ckpt;

/* Opens step_dir's manifest and checks it (its checksum, its format version, the shard list
 * covering the vector, the tensor table); the shard files are not read yet. */
zs_err zs_ckpt_open(const char *step_dir, zs_ckpt *ck);
void zs_ckpt_close(zs_ckpt *ck);

/*
 * Finds a checkpoint to resume from: path is a step directory (it has manifest.json), or a
 * checkpoint directory, meaning its newest valid checkpoint (`latest` first, then step
 * directories newest first).  Each candidate is opened and fully verified (zs_ckpt_verify);
 * one that fails is reported with ZS_WARN naming the file and the next older one is tried.
 * On success *ck is open and verified.
 */
zs_err zs_ckpt_resolve(const char *path, zs_ckpt *ck);

/*
 * Whether path holds anything a resume would try (*any = 1): a `latest` file, a step-*
 * directory, or a manifest.json (path is a step directory).  A path that does not exist, or
 * an empty directory, is *any = 0: nothing was committed there yet.  Whether those are valid
 * is zs_ckpt_resolve's to say; a restarted job uses this to tell "start fresh" from "resume",
 * so a damaged checkpoint is never mistaken for none.  Fails when path cannot be read.
 */
zs_err zs_ckpt_present(const char *path, int *any);

/* An fp16 job's loss scaler as checkpoint ck left it (after its step), checked: the manifest
 * must carry one (an fp16 job's always does), valid for cfg (zs_lossscale_check), at ck's step.
 * What a resume continues the scaler from. */
zs_err zs_ckpt_scaler(const zs_ckpt *ck, const zs_fp16_config *cfg, zs_lossscale *out);

/* Reads every shard file whole and checks its size, header and all three checksums. */
zs_err zs_ckpt_verify(const zs_ckpt *ck);

/*
 * Checks that ck continues this run: config and data fingerprints, model and vector size
 * equal those given (info: the resuming run's), and the step is < info->steps_total.  The
 * message names the manifest and the field that differs.
 */
zs_err zs_ckpt_check_compatible(const zs_ckpt *ck, const zs_ckpt_info *info);

/*
 * Reads elements [begin, end) of one array into dst (end - begin floats) from whichever shard
 * files hold them (any boundaries: resharding is reading other ranges).  Each file touched
 * has its header and that array's checksum verified as it is read (streaming, O(1 MiB)
 * memory); on a mismatch dst's contents are unspecified and the error names the file.
 */
zs_err zs_ckpt_read(const zs_ckpt *ck, zs_ckpt_array which, size_t begin, size_t end, float *dst);

/*
 * Writes out_dir/model.safetensors and out_dir/config.json (the Hugging Face model, as
 * zs_modelfile_save writes it, bit for bit) from ck's weights, streaming shard file by shard
 * file: memory O(one shard), never O(model).  The output is written under a temporary name
 * and renamed; a failure (full disk) leaves no model.safetensors and names the reason.
 * progress (may be NULL) is called after each shard file with bytes done and in all.
 */
zs_err zs_ckpt_export(const zs_ckpt *ck, const char *out_dir,
                      void (*progress)(void *user, uint64_t done, uint64_t total), void *user);

#endif
