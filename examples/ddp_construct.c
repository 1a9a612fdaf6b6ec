/* ddp_construct.c — the first example of the DDP class, in C:
 *     model = nn.Linear(10, 5); ddp_model = DDP(model, device_ids=[0]); print(type(ddp_model))
 * Construction is collective: it checks that every rank has the same model and gives
 * every rank rank 0's parameters. */
#include <stdio.h>
#include <string.h>

#include "spawn.h"
#include "worker/ddp.h"
#include "worker/model.h"

static int example(int rank, int world, struct comm *comm)
{
    struct spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_layers = 1;
    spec.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 10, .out = 5, .bias = true};
    spec.init_seed = (uint64_t)rank; /* different on purpose: DDP broadcasts rank 0's */

    struct dev dev = dev_cpu_new(1);
    struct model *model = model_new(dev, &spec, 3);
    struct ddpd_error err;
    struct ddp_opts opts = {.bucket_cap_mb = 25, .divide_by_initial_world_size = true};
    struct ddp *ddp = ddp_new(model, comm, &opts, &err);
    if (!ddp) {
        fprintf(stderr, "rank %d: %s\n", rank, err.message);
        return 1;
    }
    if (rank == 0)
        printf("DistributedDataParallel(Linear(in=10, out=5)): %d ranks, %d bucket(s), %d parameters\n",
               world, ddp_bucket_count(ddp), model_param_count(model));
    ddp_free(ddp);
    model_free(model);
    dev_cpu_free(dev);
    return 0;
}

int main(void)
{
    return example_spawn(2, example);
}
