/* ddp_no_sync.c — the third example of the DDP class, in C:
 *     with ddp_model.no_sync():
 *         res = ddp_model(data); loss = res.sum(); loss.backward()
 *     print(loss.item())
 * Inside no_sync nothing is communicated: each rank keeps its own gradient, which the
 * next synced backward will add to before averaging. */
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
    rng_seed(&g, 100 + (uint64_t)rank);
    for (int i = 0; i < 30; i++)
        data[i] = (float)rng_normal(&g);
    for (int i = 0; i < 15; i++)
        ones[i] = 1.0f;

    bool prev = ddp_no_sync_enter(ddp);
    if (ddp_forward_begin(ddp, &err))
        goto fail;
    const float *res = model_forward(model, data, 3);
    double loss = 0;
    for (int i = 0; i < 15; i++)
        loss += res[i];
    model_backward(model, ones, ddp_grad_ready, ddp);
    if (ddp_backward_end(ddp, &err))
        goto fail;
    ddp_no_sync_exit(ddp, prev);
    printf("rank %d: loss = %.9f (local: no communication inside no_sync)\n", rank, loss);
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
