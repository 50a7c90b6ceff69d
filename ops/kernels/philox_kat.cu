extern "C" __global__ void philox4x32_10_kat(const unsigned* ctr, const unsigned* key, unsigned* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
    philox4x32_10(c, key[2 * i], key[2 * i + 1]);
    for (int w = 0; w < 4; ++w) out[4 * i + w] = c[w];
}
