"""Training data: the demo corpus, tokenization into MindRecord + .npy twins,
and the sample order both frameworks follow."""
