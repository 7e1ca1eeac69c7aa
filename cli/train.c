/*
 * zshard train: the single-process trainer.  Writes OUT/metrics.jsonl (one JSON object per
 * step, common/metrics.h), OUT/model.safetensors and OUT/config.json, and a progress line per
 * step on stderr.  Ctrl-C stops after the current step and still writes the model; so does a
 * metrics line that cannot be written (a full disk), and the run then fails.
 *
 * Checkpoints as a distributed job writes them (common/ckpt.h, checkpoint.*): every
 * interval_steps, after the last step, and after a step Ctrl-C stopped the run at; each is the
 * shard files and the manifest, then the step's metrics line (naming the checkpoint), then
 * `latest`, then pruning to `keep`.  A checkpoint that fails (a full disk) is removed, logged
 * and named in the step's metrics line, and training goes on.  --resume continues from one,
 * whoever wrote it (this command, or partition servers), with the bits of an uninterrupted run.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/ckpt.h"
#include "common/config.h"
#include "common/data.h"
#include "common/log.h"
#include "common/lossscale.h"
#include "common/metrics.h"
#include "worker/trainer.h"

static const char train_usage[] =
    "usage: zshard train --config CFG.json --data PATH --steps N --out DIR\n"
    "                    [--threads T] [--device DEV] [--init DIR | --resume CKPT |\n"
    "                    --resume-if-any DIR] [--log-level LEVEL]\n"
    "\n"
    "Trains a GPT-2 model in one process.\n"
    "\n"
    "  --config CFG.json  job configuration (DeepSpeed keys plus a \"model\" block)\n"
    "  --data PATH        llm.c token shard(s), or text file(s) read as bytes; a file or a\n"
    "                     directory\n"
    "  --steps N          optimizer steps of the whole run (also when it resumes)\n"
    "  --out DIR          where metrics.jsonl, model.safetensors and config.json go, and\n"
    "                     the checkpoints unless checkpoint.dir says otherwise\n"
    "  --threads T        CPU threads (default: all CPUs available)\n"
    "  --device DEV       where forward and backward run: cpu (default), cuda or cuda:N;\n"
    "                     a GPU run is the bit-exact reference of jobs whose workers\n"
    "                     compute on that GPU model (optimizer steps stay on the CPU)\n"
    "  --init DIR         start from DIR/model.safetensors (Hugging Face GPT-2 names)\n"
    "                     instead of the seed's initialization\n"
    "  --resume CKPT      continue from a checkpoint (a step-* directory, or the newest\n"
    "                     valid one of a checkpoint directory), written by zshard train or\n"
    "                     by a distributed job on any number of servers; metrics.jsonl\n"
    "                     keeps its lines up to it\n"
    "  --resume-if-any DIR\n"
    "                     as --resume DIR when DIR holds a checkpoint, else a fresh start\n"
    "  --log-level LEVEL  error, warn, info (default) or debug\n"
    "  -h, --help         this text\n";

/* Where this run's checkpoints go, and what its manifests say of it. */
typedef struct {
    char dir[4096];   /* checkpoint.dir, or OUT/checkpoints */
    zs_ckpt_info run; /* run id, steps_total, fingerprints, model, vector size */
    int every, keep;  /* checkpoint.interval_steps, checkpoint.keep */
} ckpt_plan;

static zs_err plan_checkpoints(const zs_trainer *tr, const zs_dataset *data, const char *out,
                               long steps, ckpt_plan *cp)
{
    const zs_config *cfg = &tr->cfg;
    *cp = (ckpt_plan){.run = {.steps_total = steps,
                              .config_fingerprint = zs_config_fingerprint(cfg),
                              .data_fingerprint = data->fingerprint,
                              .data_ntokens = data->ntokens,
                              .model = cfg->model,
                              .total_floats = tr->tt.total},
                      .every = cfg->checkpoint.interval_steps,
                      .keep = cfg->checkpoint.keep};
    int n = cfg->checkpoint.dir[0] ? snprintf(cp->dir, sizeof cp->dir, "%s", cfg->checkpoint.dir)
                                   : snprintf(cp->dir, sizeof cp->dir, "%s/checkpoints", out);
    if (n >= (int)sizeof cp->dir - 32)
        return zs_error(ZS_ERR_INVALID, "checkpoint.dir %s: too long a path", cp->dir);
    if (getrandom(&cp->run.run_id, sizeof cp->run.run_id, 0) != sizeof cp->run.run_id)
        return zs_error(ZS_ERR_IO, "train: no random run id: %s", strerror(errno));
    return ZS_OK;
}

/* --resume / --resume-if-any: the checkpoint at path (resolved and verified, checked against
 * this run) into the trainer, and its run id into the plan; nothing for --resume-if-any on a
 * path that holds no checkpoint yet. */
static zs_err resume_from(zs_trainer *tr, const char *path, int if_any, ckpt_plan *cp)
{
    int any = 1;
    if (if_any)
        ZS_CHECK(zs_ckpt_present(path, &any));
    if (!any) {
        ZS_INFO("train: %s holds no checkpoint yet: a fresh start", path);
        return ZS_OK;
    }
    zs_ckpt ck;
    ZS_CHECK(zs_ckpt_resolve(path, &ck));
    zs_err res = zs_ckpt_check_compatible(&ck, &cp->run);
    if (res == ZS_OK)
        res = zs_trainer_resume(tr, &ck);
    if (res == ZS_OK) {
        cp->run.run_id = ck.info.run_id;
        ZS_INFO("train: resuming run %016llx from %s (step %ld of %ld)",
                (unsigned long long)ck.info.run_id, ck.step_dir, ck.info.step, cp->run.steps_total);
    }
    zs_ckpt_close(&ck);
    return res;
}

/* Writes checkpoint tr->step: its directory's name into name, or, when it failed (and what it
 * left is removed), the reason into why; the step's metrics line carries one of them. */
static void take_checkpoint(const zs_trainer *tr, const ckpt_plan *cp, char *name, size_t name_n,
                            char *why, size_t why_n)
{
    char sdir[4096];
    name[0] = why[0] = '\0';
    zs_err e = zs_ckpt_step_dir(cp->dir, tr->step, 1, sdir, sizeof sdir);
    if (e == ZS_OK)
        e = zs_trainer_checkpoint(tr, sdir, &cp->run);
    if (e == ZS_OK) {
        snprintf(name, name_n, "%s", strrchr(sdir, '/') + 1); /* step-%08ld */
        return;
    }
    snprintf(why, why_n, "%s", zs_last_error());
    ZS_ERROR("train: checkpoint %ld failed: %s; training goes on, and the previous checkpoint "
             "stays the newest",
             tr->step, why);
    zs_ckpt_discard(cp->dir, tr->step);
}

int zs_cmd_train(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},  {"data", required_argument, NULL, 'd'},
        {"steps", required_argument, NULL, 's'},   {"out", required_argument, NULL, 'o'},
        {"threads", required_argument, NULL, 't'}, {"init", required_argument, NULL, 'i'},
        {"device", required_argument, NULL, 'D'},  {"log-level", required_argument, NULL, 'l'},
        {"resume", required_argument, NULL, 'r'},  {"resume-if-any", required_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    const char *config_path = NULL, *data_path = NULL, *out = NULL, *init = NULL;
    const char *resume = NULL;
    int resume_if_any = 0;
    zs_device dev = {ZS_DEVICE_CPU, 0};
    long steps = -1, threads = zs_cli_cpus();
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config_path = optarg;
            break;
        case 'd':
            data_path = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'i':
            init = optarg;
            break;
        case 'r':
        case 'R':
            if (resume)
                return zs_cli_usage_error("train", "--resume and --resume-if-any exclude each "
                                                   "other, and each comes once");
            resume = optarg;
            resume_if_any = c == 'R';
            break;
        case 'D':
            if (zs_device_parse(optarg, &dev) != ZS_OK)
                return zs_cli_usage_error("train", "--device: %s", zs_last_error());
            break;
        case 's':
            if ((steps = zs_cli_int("train", "--steps", optarg, 0, 1L << 40)) < 0)
                return 2;
            break;
        case 't':
            if ((threads = zs_cli_int("train", "--threads", optarg, 1, 1024)) < 0)
                return 2;
            break;
        case 'l':
            if (zs_cli_log_level("train", optarg))
                return 2;
            break;
        case 'h':
            fputs(train_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("train", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("train", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("train", "unexpected argument \"%s\"", argv[optind]);
    if (init && resume)
        return zs_cli_usage_error("train",
                                  "--init and --%s exclude each other: a checkpoint "
                                  "holds its own weights",
                                  resume_if_any ? "resume-if-any" : "resume");
    if (!config_path || !data_path || steps < 0 || !out)
        return zs_cli_usage_error("train", "missing %s",
                                  !config_path ? "--config"
                                  : !data_path ? "--data"
                                  : steps < 0  ? "--steps"
                                               : "--out");
    zs_config cfg;
    zs_dataset data;
    zs_trainer tr;
    if (zs_config_load(config_path, &cfg) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        return 1;
    }
    if (zs_data_open(data_path, &data) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        return 1;
    }
    int rc = 1;
    zs_metrics *metrics = NULL;
    ckpt_plan cp;
    if (zs_trainer_init_on(&tr, dev, &cfg, &data, (int)threads, init) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        goto out_data;
    }
    /* The resume before anything is written: a refused one leaves nothing behind. */
    if (plan_checkpoints(&tr, &data, out, steps, &cp) != ZS_OK ||
        (resume && resume_from(&tr, resume, resume_if_any, &cp) != ZS_OK)) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        goto out_trainer;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "zshard train: --out %s: %s\n", out, strerror(errno));
        goto out_trainer;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    if (zs_metrics_open(path, tr.step > 0 ? tr.step : -1, &metrics) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        goto out_trainer;
    }
    char dev_name[16];
    zs_device_format(dev, dev_name, sizeof dev_name);
    ZS_INFO("train: %zu parameters, %d layers x %d wide, %d chunks of %d x %d tokens per step, "
            "%ld threads, forward and backward on %s, data %s (%zu tokens)",
            tr.tt.n_params, cfg.model.n_layer, cfg.model.n_embd, cfg.chunks, cfg.micro_batch,
            cfg.model.block_size, threads, dev_name, data_path, data.ntokens);
    zs_cli_catch_signals();
    /* Every write is checked, so a file size limit (ulimit -f) is better an EFBIG error that
     * names the file than SIGXFSZ killing the process with a line cut in the middle. */
    signal(SIGXFSZ, SIG_IGN);
    /* A metrics line that cannot be written (a full disk, an I/O error) stops the run after
     * that step, like Ctrl-C: the step's values still reach stderr below, the model of the
     * steps done is saved, and the run fails (exit 1).  That loses least: the weights cost the
     * most to recompute, while going on without a record would leave metrics.jsonl silently
     * short and, on a full disk, likely fail the final save after more wasted steps.  The
     * file keeps every complete line written before the failure (metrics.h). */
    /* stopping: the signal as the last step's checkpoint decision saw it, so that the loop
     * ends only after a step that was checkpointed for it (one arriving later gets the next
     * step and its checkpoint). */
    int metrics_failed = 0, latest_failed = 0, stopping = zs_cli_stop;
    while (tr.step < steps && !stopping && !metrics_failed && !latest_failed) {
        zs_step_stats st;
        if (zs_trainer_step(&tr, &st) != ZS_OK) {
            fprintf(stderr, "zshard train: step %ld: %s\n", tr.step + 1, zs_last_error());
            goto out_metrics;
        }
        /* A checkpoint every interval, after the last step, and where Ctrl-C stops the run. */
        char ckpt[64] = "", ckpt_why[512] = "";
        stopping = zs_cli_stop;
        if ((cp.every > 0 && st.step % cp.every == 0) || st.step == steps || stopping)
            take_checkpoint(&tr, &cp, ckpt, sizeof ckpt, ckpt_why, sizeof ckpt_why);
        zs_metrics_begin(metrics);
        zs_metrics_int(metrics, "step", st.step);
        zs_metrics_num(metrics, "loss", st.loss, "%.9g");
        zs_metrics_num(metrics, "lr", st.lr, "%.9g");
        zs_metrics_num(metrics, "grad_norm", st.grad_norm, "%.9g");
        zs_metrics_num(metrics, "clip", st.clip, "%.9g");
        zs_metrics_num(metrics, "tokens_per_sec", st.tokens_per_sec, "%.1f");
        zs_metrics_num(metrics, "step_ms", st.seconds * 1e3, "%.1f");
        zs_metrics_num(metrics, "compute_ms", st.seconds * 1e3, "%.1f");
        zs_metrics_num(metrics, "fetch_wait_ms", 0.0, "%.1f");
        zs_metrics_num(metrics, "push_wait_ms", 0.0, "%.1f");
        zs_metrics_int(metrics, "workers", 1);
        /* Only on a skipped step, as the coordinator writes it: the other lines are unchanged. */
        if (st.skipped)
            zs_metrics_bool(metrics, "skipped", 1);
        if (tr.cfg.fp16.enabled) { /* as the coordinator writes them (server/coord.c) */
            zs_metrics_num(metrics, "loss_scale", st.loss_scale, "%.17g");
            zs_metrics_bool(metrics, "overflow", st.skipped);
        }
        if (ckpt[0])
            zs_metrics_str(metrics, "checkpoint", ckpt);
        else if (ckpt_why[0])
            zs_metrics_str(metrics, "checkpoint_error", ckpt_why);
        if (zs_metrics_end(metrics) != ZS_OK) {
            fprintf(stderr, "zshard train: step %ld: %s\n", st.step, zs_last_error());
            metrics_failed = 1;
            /* A checkpoint whose step has no line is not committed: a resume from it would
             * lack that line. */
            if (ckpt[0])
                zs_ckpt_discard(cp.dir, st.step);
        } else if (ckpt[0]) {
            /* Committed: `latest` after the line, as the coordinator moves it; then pruning. */
            if (zs_ckpt_set_latest(cp.dir, ckpt) != ZS_OK) {
                fprintf(stderr, "zshard train: checkpoint %ld: %s\n", st.step, zs_last_error());
                latest_failed = 1;
            } else {
                zs_ckpt_prune(cp.dir, st.step, cp.keep);
            }
        }
        double eta = st.seconds * (double)(steps - st.step);
        char tail[96];
        fprintf(stderr,
                "step %5ld/%ld | loss %.4f | lr %.3e | norm %.4f | %8.0f tok/s | %.0f ms"
                " | eta %.0fs%s\n",
                st.step, steps, st.loss, st.lr, st.grad_norm, st.tokens_per_sec, st.seconds * 1e3,
                eta,
                zs_lossscale_progress(tail, sizeof tail, tr.cfg.fp16.enabled, st.loss_scale,
                                      st.skipped));
    }
    if (metrics_failed || latest_failed)
        ZS_WARN("train: stopped after step %ld: %s could not be written; saving the model", tr.step,
                metrics_failed ? "its metrics line" : "the checkpoint's latest file");
    else if (stopping)
        ZS_WARN("train: interrupted after step %ld; saving the model", tr.step);
    if (zs_trainer_save(&tr, out) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        goto out_metrics;
    }
    if (metrics_failed) {
        ZS_ERROR("train: wrote %s/model.safetensors and %s/config.json (after step %ld); "
                 "%s/metrics.jsonl ends before that step",
                 out, out, tr.step, out);
        goto out_metrics;
    }
    if (latest_failed)
        goto out_metrics;
    ZS_INFO("train: wrote %s/model.safetensors, %s/config.json, %s/metrics.jsonl", out, out, out);
    rc = stopping ? 130 : 0;
out_metrics:
    if (zs_metrics_close(metrics) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        rc = 1;
    }
out_trainer:
    zs_trainer_free(&tr);
out_data:
    zs_data_close(&data);
    return rc;
}
