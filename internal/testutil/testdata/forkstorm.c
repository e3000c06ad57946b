/* forkstorm N: forks N processes that exit at once, reaping as it goes (a
 * hostile tenant's fork storm, TestForkStormLeavesTheDaemonResponsive). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 20000;

	for (int i = 0; i < n; i++) {
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
	return 0;
}
