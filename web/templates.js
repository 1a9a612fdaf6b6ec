/* templates.js — job specs to start from on the Submit page (schema/README.md). The first is
 * examples/seed.json as it is, 'gpt' examples/gpt-char.json and 'cnn' examples/digits-cnn.json
 * (the browser test checks that they agree, and that the server accepts the last two). */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});

  /* One pre-norm transformer block (examples/gpt-char.json's): attention, then an MLP 4x
   * as wide with gelu (tanh), each inside a residual. */
  function gptBlock(dim, heads) {
    return [
      {type: 'residual', layers: [
        {type: 'layernorm', dim},
        {type: 'attention', dim, heads, causal: true}]},
      {type: 'residual', layers: [
        {type: 'layernorm', dim},
        {type: 'linear', in: dim, out: 4 * dim},
        {type: 'gelu', approximate: 'tanh'},
        {type: 'linear', in: 4 * dim, out: dim}]},
    ];
  }

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
    {
      id: 'gpt',
      title: 'Character GPT',
      about: 'A 2-block GPT (dim 64, 4 heads, T 64, byte vocabulary 256) with AdamW on a tokens file, 2 ranks, ' +
        'eval every 100 steps (examples/gpt-char.json; python3 examples/gpt_char_data.py writes gpt-char/train.bin and gpt-char/eval.bin into the data directory).',
      spec: {
        name: 'gpt-char',
        world_size: 2,
        device: 'cpu',
        input_shape: [64],
        model: [
          {type: 'embedding', num: 256, dim: 64},
          {type: 'position', max: 64, dim: 64},
          {type: 'dropout', p: 0},
          ...gptBlock(64, 4),
          ...gptBlock(64, 4),
          {type: 'layernorm', dim: 64},
          {type: 'linear', in: 64, out: 256},
        ],
        loss: 'cross_entropy',
        optimizer: {type: 'adamw', lr: 0.003},
        data: {type: 'tokens', path: 'gpt-char/train.bin', block_size: 64, seed: 1},
        eval: {data: {type: 'tokens', path: 'gpt-char/eval.bin', block_size: 64}, every_steps: 100},
        batch_size: 16,
        steps: 300,
        log_every: 1,
      },
    },
    {
      id: 'cnn',
      title: 'Digits conv net',
      about: 'Two 3x3 conv layers with BatchNorm, max pooling and an MLP head on 8x8 digit images (digits/x.npy [N,1,8,8], ' +
        'y.npy class ids), SGD with a cosine schedule, 2 ranks, eval every 40 steps (examples/digits-cnn.json; ' +
        'python3 examples/digits_data.py writes the files into digits/ of the data directory).',
      spec: {
        name: 'digits-cnn',
        world_size: 2,
        device: 'cpu',
        input_shape: [1, 8, 8],
        model: [
          {type: 'conv2d', in: 1, out: 16, kernel: 3, padding: 1},
          {type: 'batchnorm', features: 16},
          {type: 'relu'},
          {type: 'conv2d', in: 16, out: 32, kernel: 3, padding: 1},
          {type: 'batchnorm', features: 32},
          {type: 'relu'},
          {type: 'maxpool2d', kernel: 2},
          {type: 'flatten'},
          {type: 'linear', in: 512, out: 64},
          {type: 'batchnorm', features: 64},
          {type: 'relu'},
          {type: 'linear', in: 64, out: 10},
        ],
        loss: 'cross_entropy',
        optimizer: {type: 'sgd', lr: 0.1, momentum: 0.9, weight_decay: 0.0001,
          schedule: {type: 'cosine', warmup_steps: 10}},
        data: {type: 'npy', x: 'digits/x.npy', y: 'digits/y.npy', seed: 1},
        eval: {data: {type: 'npy', x: 'digits/eval_x.npy', y: 'digits/eval_y.npy'}, every_steps: 40},
        batch_size: 32,
        epochs: 8,
        log_every: 10,
      },
    },
  ];
})();
