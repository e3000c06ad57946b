/* unfreezable: a process the cgroup freezer cannot freeze. It registers a
 * page with userfaultfd and has the kernel copy into it (read of
 * /dev/zero): the copy faults, and with nobody to answer the fault the
 * task waits in the kernel where no freeze reaches it, until killed. It
 * prints "ready" first. Needs root (or vm.unprivileged_userfaultfd). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };
	int uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
	char *page;
	int zero;

	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("userfaultfd");
		return 1;
	}
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	reg.range.start = (unsigned long)page;
	reg.range.len = 4096;
	if (page == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("userfaultfd register");
		return 1;
	}
	zero = open("/dev/zero", O_RDONLY);
	if (zero < 0) {
		perror("/dev/zero");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	if (read(zero, page, 4096) < 0)
		perror("read");
	return 0;
}
