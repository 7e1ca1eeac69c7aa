/* tensors: the GPT-2 layout of the flat vector and its seeded initialization. */
#include <math.h>
#include <stdlib.h>

#include "common/tensors.h"
#include "tests/unit/test.h"

static void test_gpt2_124m(void)
{
    zs_model_config m = {
        .n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024};
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&m, &tt));
    /* Hugging Face's gpt2 has 124,439,808 parameters. */
    CHECK_EQ_INT(tt.n_params, 124439808);
    CHECK_EQ_INT(tt.count, 2 + 12 * 12 + 2);
    CHECK_EQ_INT(tt.n_layers, 14);
    int aligned = 1, ordered = 1, inside = 1;
    for (int i = 0; i < tt.count; i++) {
        const zs_tensor *t = &tt.tensors[i];
        aligned &= t->offset % ZS_TENSOR_ALIGN == 0;
        if (i > 0)
            ordered &= t->offset >= tt.tensors[i - 1].offset + tt.tensors[i - 1].numel;
        inside &= t->offset >= tt.layer_begin[t->layer] &&
                  t->offset + t->numel <= tt.layer_begin[t->layer + 1];
    }
    CHECK(aligned);
    CHECK(ordered);
    CHECK(inside);
    CHECK_EQ_INT(tt.layer_begin[14], tt.total);
    for (int l = 0; l <= 14; l++)
        CHECK_EQ_INT(tt.layer_begin[l] % ZS_TENSOR_ALIGN, 0);
    const zs_tensor *t = zs_tensors_find(&tt, "h.3.attn.c_attn.weight");
    CHECK(t != NULL);
    CHECK(t == zs_tensors_find(&tt, "transformer.h.3.attn.c_attn.weight"));
    CHECK(t == zs_tensors_get(&tt, 3, ZS_T_QKV_W));
    CHECK_EQ_INT(t->shape[0], 768);
    CHECK_EQ_INT(t->shape[1], 2304);
    CHECK_EQ_INT(t->layer, 4);
    CHECK(t->decay);
    CHECK(!zs_tensors_get(&tt, 3, ZS_T_QKV_B)->decay);
    CHECK(zs_tensors_find(&tt, "lm_head.weight") == NULL);
    CHECK(zs_tensors_find(&tt, "h.12.ln_1.weight") == NULL);
    CHECK(zs_tensors_get(&tt, 0, ZS_T_LNF_B) == &tt.tensors[tt.count - 1]);
    CHECK_EQ_INT(zs_tensors_get(&tt, 0, ZS_T_WTE)->shape[0], 50257);
    zs_tensors_free(&tt);
    m.n_head = 7;
    CHECK_FAILS_WITH(zs_tensors_gpt2(&m, &tt), "n_head 7");
}

static zs_err count_span(void *ctx, size_t b, size_t e, const zs_tensor *t)
{
    size_t *sum = ctx;
    (void)t;
    *sum += e - b;
    return ZS_OK;
}

static void test_spans_and_init(void)
{
    zs_model_config m = {
        .n_layer = 2, .n_head = 2, .n_embd = 20, .vocab_size = 37, .block_size = 9};
    zs_tensor_table tt;
    CHECK_OK(zs_tensors_gpt2(&m, &tt));
    size_t sum = 0;
    CHECK_OK(zs_tensors_spans(&tt, 0, tt.total, count_span, &sum));
    CHECK_EQ_INT(sum, tt.n_params);
    sum = 0;
    CHECK_OK(zs_tensors_spans(&tt, 100, 1000, count_span, &sum));
    CHECK(sum <= 900 && sum > 0);

    float *all = malloc(tt.total * sizeof *all);
    float *part = malloc(tt.total * sizeof *part);
    zs_tensors_init_gpt2(&tt, 1234, all, 0, tt.total);
    /* Any split of the vector gives the same bits (what partition servers rely on). */
    size_t cuts[] = {0, 17, 640, 641, 2000, tt.total};
    for (int i = 0; i + 1 < 6; i++)
        zs_tensors_init_gpt2(&tt, 1234, part + cuts[i], cuts[i], cuts[i + 1]);
    CHECK(memcmp(all, part, tt.total * sizeof *all) == 0);
    zs_tensors_init_gpt2(&tt, 1235, part, 0, tt.total);
    CHECK(memcmp(all, part, tt.total * sizeof *all) != 0);
    const zs_tensor *ln = zs_tensors_get(&tt, 1, ZS_T_LN2_W);
    const zs_tensor *bias = zs_tensors_get(&tt, 1, ZS_T_FC_B);
    int ones = 1, zeros = 1;
    for (size_t i = 0; i < ln->numel; i++)
        ones &= all[ln->offset + i] == 1.0f;
    for (size_t i = 0; i < bias->numel; i++)
        zeros &= all[bias->offset + i] == 0.0f;
    CHECK(ones);
    CHECK(zeros);
    /* Padding stays zero. */
    const zs_tensor *t0 = &tt.tensors[0];
    int pad = 1;
    for (size_t i = t0->offset + t0->numel; i < tt.tensors[1].offset; i++)
        pad &= all[i] == 0.0f;
    CHECK(pad);
    zs_tensors_free(&tt);

    /* Moments of the normals on a larger tensor: std 0.02, c_proj 0.02/sqrt(2L). */
    m = (zs_model_config){
        .n_layer = 8, .n_head = 4, .n_embd = 256, .vocab_size = 64, .block_size = 16};
    CHECK_OK(zs_tensors_gpt2(&m, &tt));
    float *w = malloc(tt.total * sizeof *w);
    zs_tensors_init_gpt2(&tt, 9, w, 0, tt.total);
    const zs_tensor *fc = zs_tensors_get(&tt, 0, ZS_T_FC_W);
    const zs_tensor *proj = zs_tensors_get(&tt, 0, ZS_T_FCPROJ_W);
    double s1 = 0, s2 = 0, p2 = 0;
    for (size_t i = 0; i < fc->numel; i++) {
        s1 += w[fc->offset + i];
        s2 += (double)w[fc->offset + i] * w[fc->offset + i];
    }
    for (size_t i = 0; i < proj->numel; i++)
        p2 += (double)w[proj->offset + i] * w[proj->offset + i];
    double n = (double)fc->numel;
    /* 262144 samples: the std estimate is within 1% with overwhelming probability. */
    CHECK_NEAR(sqrt(s2 / n), 0.02, 0.0002);
    CHECK_NEAR(s1 / n, 0.0, 0.0002);
    CHECK_NEAR(sqrt(p2 / (double)proj->numel), 0.02 / 4.0, 0.00005);
    free(w);
    free(all);
    free(part);
    zs_tensors_free(&tt);
}

int main(void)
{
    test_gpt2_124m();
    test_spans_and_init();
    return zs_test_result("test_tensors");
}
