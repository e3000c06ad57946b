/* Times calls of a probed libcuda entry point (cuLaunchKernel, which returns
 * at once before cuInit) and prints ns per call. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			unsigned shmem, void *stream, void **params, void **extra);

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
