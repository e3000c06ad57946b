/* rawalloc: allocates device memory through raw nvidia RM ioctls, as a
 * program without libcuda would, on the control node NODE:
 *
 *   rawalloc NODE MODE STEP COUNT
 *
 * MODE is rmalloc (NVOS64 RM_ALLOC of NV01_MEMORY_LOCAL_USER, size at byte
 * 64 of its 128-byte parameters), xfer (the same in IOCTL_XFER_CMD) or
 * vidheap (RM_VID_HEAP_CONTROL ALLOC_SIZE, the size at byte 88). It makes
 * a device object (deviceId 0) first, then COUNT allocations of STEP
 * bytes, printing "held BYTES" after each, then "done", and waits for
 * stdin to close; "free" on stdin frees every allocation (RM_FREE of each)
 * and "freedev" the device (which frees what is under it), each printing
 * "freed". */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define IOC_RW 3u
#define NV_IOWR(nr, size) ((IOC_RW << 30) | ((uint32_t)(size) << 16) | ('F' << 8) | (nr))
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_RM_VID_HEAP_CONTROL 0x4A
#define NV_ESC_IOCTL_XFER_CMD 211

typedef struct { uint32_t hRoot, hObjectParent, hObjectNew, hClass; uint64_t pAllocParms, pRightsRequested; uint32_t paramsSize, flags, status, pad; } NVOS64;
typedef struct { uint32_t hRoot, hObjectParent, hObjectOld, status; } NVOS00;
typedef struct { uint32_t cmd, size; uint64_t ptr; } XFER;

static int fd;
static uint32_t client = 0xc1d0beef, device = 0xd0000001;

static void alloc64(uint32_t parent, uint32_t handle, uint32_t cls, void *params, int xfer)
{
	NVOS64 p = { client, parent, handle, cls, (uint64_t)(uintptr_t)params, 0, 0, 0, 0, 0 };
	XFER x = { NV_ESC_RM_ALLOC, sizeof(p), (uint64_t)(uintptr_t)&p };

	if (xfer)
		ioctl(fd, NV_IOWR(NV_ESC_IOCTL_XFER_CMD, sizeof(x)), &x);
	else
		ioctl(fd, NV_IOWR(NV_ESC_RM_ALLOC, sizeof(p)), &p);
}

static void vidheap(uint32_t handle, uint64_t bytes)
{
	uint8_t p[184];

	memset(p, 0, sizeof(p));
	memcpy(p + 0, &client, 4);
	memcpy(p + 4, &device, 4);
	*(uint32_t *)(p + 8) = 2; /* NVOS32_FUNCTION_ALLOC_SIZE */
	memcpy(p + 44, &handle, 4);
	memcpy(p + 88, &bytes, 8);
	ioctl(fd, NV_IOWR(NV_ESC_RM_VID_HEAP_CONTROL, sizeof(p)), p);
}

int main(int argc, char **argv)
{
	uint32_t dev_params[16] = { 0 }; /* NV0080_ALLOC_PARAMETERS: deviceId 0 */
	uint64_t step, held = 0;
	long count;
	char line[64];

	if (argc != 5) {
		fprintf(stderr, "usage: rawalloc NODE rmalloc|xfer|vidheap STEP COUNT\n");
		return 2;
	}
	fd = open(argv[1], O_RDWR);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	step = strtoull(argv[3], NULL, 0);
	count = strtol(argv[4], NULL, 0);
	setvbuf(stdout, NULL, _IONBF, 0);
	alloc64(client, device, 0x80, dev_params, 0);
	for (long i = 0; i < count; i++) {
		uint32_t handle = 0xe0000000u + (uint32_t)i;

		if (!strcmp(argv[2], "vidheap")) {
			vidheap(handle, step);
		} else {
			uint8_t params[128];

			memset(params, 0, sizeof(params));
			memcpy(params + 64, &step, 8);
			alloc64(device, handle, 0x40, params, !strcmp(argv[2], "xfer"));
		}
		held += step;
		printf("held %llu\n", (unsigned long long)held);
	}
	printf("done\n");
	while (fgets(line, sizeof(line), stdin)) {
		if (!strncmp(line, "freedev", 7)) {
			NVOS00 f = { client, client, device, 0 };

			ioctl(fd, NV_IOWR(NV_ESC_RM_FREE, sizeof(f)), &f);
		} else if (!strncmp(line, "free", 4)) {
			for (long i = 0; i < count; i++) {
				NVOS00 f = { client, device, 0xe0000000u + (uint32_t)i, 0 };

				ioctl(fd, NV_IOWR(NV_ESC_RM_FREE, sizeof(f)), &f);
			}
		} else {
			continue;
		}
		printf("freed\n");
	}
	return 0;
}
