/* ddp_forward_backward.c — the second example of the DDP class, in C:
 *     data = torch.randn(3, 10); res = ddp_model(data); loss = res.sum(); loss.backward()
 *     print(res.shape)   # torch.Size([3, 5])
 * Backward reduces the gradients across ranks: afterwards both ranks hold the same. */
#include <stdio.h>
#include <string.h>

#include "spawn.h"
#include "worker/ddp.h"
#include "worker/model.h"
#include "worker/rng.h"

static int example(int rank, int world, struct comm *comm)
{
    (void)world;
    struct spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_layers = 1;
    spec.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 10, .out = 5, .bias = true};

    struct dev dev = dev_cpu_new(1);
    struct model *model = model_new(dev, &spec, 3);
    struct ddpd_error err;
    struct ddp_opts opts = {.bucket_cap_mb = 25, .divide_by_initial_world_size = true};
    struct ddp *ddp = ddp_new(model, comm, &opts, &err);
    if (!ddp) {
        fprintf(stderr, "rank %d: %s\n", rank, err.message);
        return 1;
    }

    float data[3 * 10], ones[3 * 5];
    struct rng g;
    rng_seed(&g, 100 + (uint64_t)rank); /* torch.randn: different data on each rank */
    for (int i = 0; i < 30; i++)
        data[i] = (float)rng_normal(&g);
    for (int i = 0; i < 15; i++)
        ones[i] = 1.0f; /* d(res.sum())/d(res) */

    if (ddp_forward_begin(ddp, &err))
        goto fail;
    model_forward(model, data, 3);
    model_backward(model, ones, ddp_grad_ready, ddp);
    if (ddp_backward_end(ddp, &err))
        goto fail;
    /* The output of model_forward is [B, out]: B rows of the model's output width. */
    if (rank == 0)
        printf("res.shape = [%d, %lld]; 0.bias.grad[0] averaged over ranks = %.4f\n", 3,
               (long long)spec_out_width(&spec), model_param(model, 1)->grad[0]);
    ddp_free(ddp);
    model_free(model);
    dev_cpu_free(dev);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, err.message);
    return 1;
}

int main(void)
{
    return example_spawn(2, example);
}
