/* templates.js — job specs to start from on the Submit page (schema/README.md). The first is
 * examples/seed.json as it is (the browser test checks that they agree). */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});

  ddpd.templates = [
    {
      id: 'seed',
      title: 'Seed example',
      about: 'Linear(10,5), batch 3, MSE, SGD lr 0.01 on 3,000 synthetic samples (examples/seed.json).',
      spec: {
        name: 'seed-example',
        world_size: 1,
        device: 'cpu',
        model: [{type: 'linear', in: 10, out: 5}],
        loss: 'mse',
        optimizer: {type: 'sgd', lr: 0.01},
        data: {type: 'synthetic', samples: 3000, seed: 1},
        batch_size: 3,
        epochs: 1,
        log_every: 100,
      },
    },
    {
      id: 'mlp',
      title: 'MLP classification',
      about: 'A 3-layer MLP with ReLU, cross entropy and AdamW on 8,000 synthetic samples in 4 classes, 2 ranks.',
      spec: {
        name: 'mlp-classification',
        world_size: 2,
        model: [
          {type: 'linear', in: 20, out: 64},
          {type: 'relu'},
          {type: 'linear', in: 64, out: 64},
          {type: 'relu'},
          {type: 'linear', in: 64, out: 4},
        ],
        loss: 'cross_entropy',
        optimizer: {type: 'adamw', lr: 0.001, weight_decay: 0.01},
        data: {type: 'synthetic', samples: 8000, seed: 7},
        batch_size: 32,
        epochs: 5,
        log_every: 5,
      },
    },
    {
      id: 'join',
      title: 'Uneven shards with join',
      about: '3,001 samples over 2 ranks in batches of 10: rank 0 has one batch more, so rank 1 joins early each epoch.',
      spec: {
        name: 'uneven-join',
        world_size: 2,
        model: [{type: 'linear', in: 10, out: 16}, {type: 'tanh'}, {type: 'linear', in: 16, out: 5}],
        loss: 'mse',
        optimizer: {type: 'sgd', lr: 0.02, momentum: 0.9},
        data: {type: 'synthetic', samples: 3001, seed: 3},
        batch_size: 10,
        epochs: 3,
        ddp: {join: true},
        log_every: 1,
      },
    },
    {
      id: 'accum',
      title: 'Gradient accumulation',
      about: '4 micro-batches of 8 per optimizer step (the first 3 under no_sync), 2 ranks, a checkpoint every 50 steps.',
      spec: {
        name: 'grad-accum',
        world_size: 2,
        model: [{type: 'linear', in: 10, out: 32}, {type: 'gelu'}, {type: 'linear', in: 32, out: 5}],
        loss: 'mse',
        optimizer: {type: 'sgd', lr: 0.005},
        data: {type: 'synthetic', samples: 6400, seed: 5},
        batch_size: 8,
        grad_accum: 4,
        epochs: 2,
        checkpoint: {every_steps: 50},
        log_every: 1,
      },
    },
  ];
})();
