/*
 * zshard eval: mean cross-entropy of a model directory (as `zshard train` writes it, or a
 * Hugging Face GPT-2 checkpoint) over the first K sequences of some data; sequence i is
 * tokens [i*T, i*T+T) predicting [i*T+1, i*T+T+1).  Prints "loss <value>" on stdout.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/config.h"
#include "common/data.h"
#include "common/log.h"
#include "common/modelfile.h"
#include "kernels/adamw.h"
#include "kernels/model.h"

static const char eval_usage[] =
    "usage: zshard eval --model DIR --data PATH [--seqs K] [--seq-len T] [--threads N]\n"
    "                   [--device DEV] [--bf16]\n"
    "\n"
    "Prints the mean cross-entropy (nats per token) of a model on data as \"loss <value>\".\n"
    "\n"
    "  --model DIR    config.json + model.safetensors (zshard train's output, or HF GPT-2)\n"
    "  --data PATH    llm.c token shard(s) or text file(s), a file or a directory\n"
    "  --seqs K       evaluate the first K sequences (default: all that fit)\n"
    "  --seq-len T    tokens per sequence (default: the model's n_positions)\n"
    "  --threads N    CPU threads (default: all CPUs available)\n"
    "  --device DEV   where the forward runs: cpu (default), cuda or cuda:N\n"
    "  --bf16         compute as a bf16.enabled job's workers do: the weights rounded to\n"
    "                 bf16, and on a GPU the products' operands in bf16 (docs/precision.md)\n"
    "  -h, --help     this text\n";

#define EVAL_BATCH 8

int zs_cmd_eval(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"data", required_argument, NULL, 'd'},
                                         {"seqs", required_argument, NULL, 'k'},
                                         {"seq-len", required_argument, NULL, 't'},
                                         {"threads", required_argument, NULL, 'n'},
                                         {"device", required_argument, NULL, 'D'},
                                         {"bf16", no_argument, NULL, 'b'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *model_dir = NULL, *data_path = NULL;
    long seqs = -1, seq_len = -1, threads = zs_cli_cpus();
    zs_device dev = {ZS_DEVICE_CPU, 0};
    zs_precision precision = ZS_PRECISION_FP32;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_dir = optarg;
            break;
        case 'd':
            data_path = optarg;
            break;
        case 'b':
            precision = ZS_PRECISION_BF16;
            break;
        case 'D':
            if (zs_device_parse(optarg, &dev) != ZS_OK)
                return zs_cli_usage_error("eval", "--device: %s", zs_last_error());
            break;
        case 'k':
            if ((seqs = zs_cli_int("eval", "--seqs", optarg, 1, 1L << 40)) < 0)
                return 2;
            break;
        case 't':
            if ((seq_len = zs_cli_int("eval", "--seq-len", optarg, 1, 1 << 20)) < 0)
                return 2;
            break;
        case 'n':
            if ((threads = zs_cli_int("eval", "--threads", optarg, 1, 1024)) < 0)
                return 2;
            break;
        case 'h':
            fputs(eval_usage, stdout);
            return 0;
        case ':':
            return zs_cli_usage_error("eval", "%s needs a value", argv[optind - 1]);
        default:
            return zs_cli_usage_error("eval", "unknown option \"%s\"", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return zs_cli_usage_error("eval", "unexpected argument \"%s\"", argv[optind]);
    if (!model_dir || !data_path)
        return zs_cli_usage_error("eval", "missing %s", !model_dir ? "--model" : "--data");

    zs_model_config mc;
    zs_tensor_table tt;
    float *params = NULL;
    if (zs_modelfile_load(model_dir, &mc, &tt, &params) != ZS_OK) {
        fprintf(stderr, "zshard eval: %s\n", zs_last_error());
        return 1;
    }
    if (precision == ZS_PRECISION_BF16) /* what a bf16 job's workers compute with */
        for (size_t i = 0; i < tt.total; i++)
            params[i] = zs_bf16_to_f32(zs_f32_to_bf16(params[i]));
    int rc = 1;
    zs_dataset data;
    zs_model *model = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    if (zs_data_open(data_path, &data) != ZS_OK) {
        fprintf(stderr, "zshard eval: %s\n", zs_last_error());
        goto out_model;
    }
    int T = seq_len > 0 ? (int)seq_len : mc.block_size;
    if (T > mc.block_size) {
        fprintf(stderr, "zshard eval: --seq-len %d exceeds the model's n_positions %d\n", T,
                mc.block_size);
        goto out_data;
    }
    if (zs_data_check(&data, mc.vocab_size, T) != ZS_OK) {
        fprintf(stderr, "zshard eval: %s: %s\n", data_path, zs_last_error());
        goto out_data;
    }
    size_t avail = zs_data_eval_count(&data, T);
    size_t K = seqs > 0 ? (size_t)seqs : avail;
    if (K > avail) {
        fprintf(stderr, "zshard eval: --seqs %zu, but %s holds only %zu sequences of %d tokens\n",
                K, data_path, avail, T);
        goto out_data;
    }
    int maxb = K < EVAL_BATCH ? (int)K : EVAL_BATCH;
    inputs = malloc((size_t)maxb * T * sizeof *inputs);
    targets = malloc((size_t)maxb * T * sizeof *targets);
    if (!inputs || !targets) {
        fprintf(stderr, "zshard eval: out of memory\n");
        goto out_data;
    }
    if (zs_model_create(dev, &mc, &tt, maxb, T, (int)threads, precision, &model) != ZS_OK) {
        fprintf(stderr, "zshard eval: %s\n", zs_last_error());
        goto out_data;
    }
    float *dev_params = params; /* the weights in the model's memory */
    if (!zs_model_on_host(model) &&
        (zs_model_alloc(model, tt.total * sizeof(float), (void **)&dev_params) != ZS_OK ||
         zs_model_upload(model, dev_params, params, tt.total * sizeof(float)) != ZS_OK)) {
        fprintf(stderr, "zshard eval: %s\n", zs_last_error());
        goto out_model_mem;
    }
    zs_gpt2_flat flat = {.params = dev_params, .grads = NULL};
    zs_gpt2_io io = zs_gpt2_flat_io(&flat);
    /* Batches of sequences; each batch's mean weighted by its size, summed in order. */
    double total = 0;
    for (size_t i = 0; i < K; i += (size_t)maxb) {
        int b = K - i < (size_t)maxb ? (int)(K - i) : maxb;
        for (int j = 0; j < b; j++)
            zs_data_eval_seq(&data, i + (size_t)j, T, inputs + (size_t)j * T,
                             targets + (size_t)j * T);
        float loss;
        if (zs_model_forward(model, &io, inputs, targets, b, T, &loss) != ZS_OK) {
            fprintf(stderr, "zshard eval: %s\n", zs_last_error());
            goto out_model_mem;
        }
        zs_model_finish(model, &io);
        total += (double)loss * b;
    }
    printf("loss %.6f\n", total / (double)K);
    rc = 0;
out_model_mem:
    if (dev_params != params)
        zs_model_dealloc(model, dev_params);
    zs_model_free(model);
out_data:
    free(inputs);
    free(targets);
    zs_data_close(&data);
out_model:
    free(params);
    zs_tensors_free(&tt);
    return rc;
}
