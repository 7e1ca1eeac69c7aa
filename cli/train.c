/*
 * zshard train: the single-process trainer.  Writes OUT/metrics.jsonl (one JSON object per
 * step, common/metrics.h), OUT/model.safetensors and OUT/config.json, and a progress line per
 * step on stderr.  Ctrl-C stops after the current step and still writes the model; so does a
 * metrics line that cannot be written (a full disk), and the run then fails.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/config.h"
#include "common/data.h"
#include "common/log.h"
#include "common/lossscale.h"
#include "common/metrics.h"
#include "worker/trainer.h"

static const char train_usage[] =
    "usage: zshard train --config CFG.json --data PATH --steps N --out DIR\n"
    "                    [--threads T] [--device DEV] [--init DIR] [--log-level LEVEL]\n"
    "\n"
    "Trains a GPT-2 model in one process.\n"
    "\n"
    "  --config CFG.json  job configuration (DeepSpeed keys plus a \"model\" block)\n"
    "  --data PATH        llm.c token shard(s), or text file(s) read as bytes; a file or a\n"
    "                     directory\n"
    "  --steps N          optimizer steps to run\n"
    "  --out DIR          where metrics.jsonl, model.safetensors and config.json go\n"
    "  --threads T        CPU threads (default: all CPUs available)\n"
    "  --device DEV       where forward and backward run: cpu (default), cuda or cuda:N;\n"
    "                     a GPU run is the bit-exact reference of jobs whose workers\n"
    "                     compute on that GPU model (optimizer steps stay on the CPU)\n"
    "  --init DIR         start from DIR/model.safetensors (Hugging Face GPT-2 names)\n"
    "                     instead of the seed's initialization\n"
    "  --log-level LEVEL  error, warn, info (default) or debug\n"
    "  -h, --help         this text\n";

int zs_cmd_train(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},  {"data", required_argument, NULL, 'd'},
        {"steps", required_argument, NULL, 's'},   {"out", required_argument, NULL, 'o'},
        {"threads", required_argument, NULL, 't'}, {"init", required_argument, NULL, 'i'},
        {"device", required_argument, NULL, 'D'},  {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    const char *config_path = NULL, *data_path = NULL, *out = NULL, *init = NULL;
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
    if (zs_trainer_init_on(&tr, dev, &cfg, &data, (int)threads, init) != ZS_OK) {
        fprintf(stderr, "zshard train: %s\n", zs_last_error());
        goto out_data;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "zshard train: --out %s: %s\n", out, strerror(errno));
        goto out_trainer;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    if (zs_metrics_open(path, -1, &metrics) != ZS_OK) {
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
    int metrics_failed = 0;
    for (long s = 0; s < steps && !zs_cli_stop && !metrics_failed; s++) {
        zs_step_stats st;
        if (zs_trainer_step(&tr, &st) != ZS_OK) {
            fprintf(stderr, "zshard train: step %ld: %s\n", s + 1, zs_last_error());
            goto out_metrics;
        }
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
        if (zs_metrics_end(metrics) != ZS_OK) {
            fprintf(stderr, "zshard train: step %ld: %s\n", st.step, zs_last_error());
            metrics_failed = 1;
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
    if (metrics_failed)
        ZS_WARN("train: stopped after step %ld: its metrics line could not be written; "
                "saving the model",
                tr.step);
    else if (zs_cli_stop)
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
    ZS_INFO("train: wrote %s/model.safetensors, %s/config.json, %s/metrics.jsonl", out, out, out);
    rc = zs_cli_stop ? 130 : 0;
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
