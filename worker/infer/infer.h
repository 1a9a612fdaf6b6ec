/* infer/infer.h — `ddpd-worker --infer`: a long-lived process that holds at most one
 * trained model and answers requests for it, one JSON object a line on stdin and one final
 * line each on stdout (load, generate with streamed tokens and cancel, predict, unload;
 * docs/generation.md and the server's inference pool speak it). Runs what the training
 * engine runs (model.c, the layer families, the device table) in eval mode; knows nothing
 * of HTTP, the store or jobs. Single-threaded apart from what OpenBLAS does. */
#ifndef DDPD_INFER_H
#define DDPD_INFER_H

/* The largest max_new_tokens a generate request may ask for (the server's cap too). */
#define INFER_MAX_NEW_TOKENS 4096

/* Serves requests from stdin until it ends; returns the exit status (0). */
int infer_main(void);

#endif
