/* ddp_join.c — the fourth example of the DDP class, in C: training with SGD and MSE on
 * uneven inputs inside join:
 *     with ddp_model.join():
 *         for data, target in my_batches:     # rank 0: 3 batches, rank 1: 5
 *             opt.zero_grad(); loss = mse(ddp_model(data), target); loss.backward(); opt.step()
 * Rank 0 runs out first and shadows rank 1's last two steps; afterwards both ranks hold
 * the same model. */
#include <stdio.h>
#include <string.h>

#include "spawn.h"
#include "worker/ddp.h"
#include "worker/model.h"
#include "worker/optim.h"
#include "worker/rng.h"

static int example(int rank, int world, struct comm *comm)
{
    (void)world;
    struct spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_layers = 1;
    spec.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 10, .out = 5, .bias = true};
    struct spec_optim sgd = {.kind = OPTIM_SGD, .lr = 0.01};

    struct dev dev = dev_cpu_new(1);
    struct model *model = model_new(dev, &spec, 3);
    struct optim *opt = optim_new(&sgd, model);
    struct ddpd_error err;
    struct ddp_opts opts = {.bucket_cap_mb = 25, .join = true, .divide_by_initial_world_size = true};
    struct ddp *ddp = ddp_new(model, comm, &opts, &err);
    if (!ddp) {
        fprintf(stderr, "rank %d: %s\n", rank, err.message);
        return 1;
    }
    struct rng g;
    rng_seed(&g, 7 + (uint64_t)rank);
    const int batches = rank == 0 ? 3 : 5;
    float data[3 * 10], target[3 * 5], dpred[3 * 5], *loss = dev.ops->alloc(dev.ctx, sizeof(float));
    for (int b = 0; b < batches; b++) {
        for (int i = 0; i < 30; i++)
            data[i] = (float)rng_normal(&g);
        for (int i = 0; i < 15; i++)
            target[i] = (float)rng_normal(&g);
        model_zero_grad(model);
        if (ddp_forward_begin(ddp, &err))
            goto fail;
        const float *out = model_forward(model, data, 3);
        dev.ops->mse(dev.ctx, out, target, 3, 5, dpred, loss);
        model_backward(model, dpred, ddp_grad_ready, ddp);
        if (ddp_backward_end(ddp, &err))
            goto fail;
        optim_step(opt);
        float l;
        dev.ops->to_host(dev.ctx, &l, loss, sizeof l);
        printf("rank %d: step %d loss %.6f\n", rank, b + 1, l);
    }
    int64_t shadowed;
    if (ddp_join(ddp, &shadowed, &err))
        goto fail;
    float w;
    dev.ops->to_host(dev.ctx, &w, model_param(model, 0)->data, sizeof w);
    printf("rank %d: joined after %d batches, shadowed %lld steps; 0.weight[0,0] = %.7f\n", rank, batches,
           (long long)shadowed, w);
    dev.ops->free(dev.ctx, loss);
    ddp_free(ddp);
    optim_free(opt);
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
