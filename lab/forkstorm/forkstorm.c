/* forkstorm FORKS [ROUNDS]: a hostile tenant's fork storm. It waits for a line
 * on stdin (the caller attaches it first, as a pid tenant say), then forks
 * FORKS processes that exit at once, reaping as it goes, ROUNDS times (1 by
 * default), and prints after each round the seconds it took ("round 0.512").
 * Built into bin/ by make; run by lab.ForkStorm. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int forks = argc > 1 ? atoi(argv[1]) : 0, rounds = argc > 2 ? atoi(argv[2]) : 1;
	char line[16];

	if (forks <= 0 || rounds <= 0) {
		fprintf(stderr, "usage: forkstorm FORKS [ROUNDS]: both positive\n");
		return 2;
	}
	if (!fgets(line, sizeof line, stdin))
		return 1; /* the caller went away before the start */
	for (int r = 0; r < rounds; r++) {
		double start = now();

		for (int i = 0; i < forks; i++) {
			pid_t p = fork();

			if (p == 0)
				_exit(0);
			if (p < 0) {
				perror("fork");
				return 1;
			}
			if (i % 64 == 63)
				while (waitpid(-1, NULL, WNOHANG) > 0)
					;
		}
		while (wait(NULL) > 0)
			;
		printf("round %.6f\n", now() - start);
		fflush(stdout);
	}
	return 0;
}
