/* Target of tests/bpf/test_user_probes.py: prints "ready pid=N", waits for a line on stdin,
 * then calls process_batch(batch_size, model) for each (size, model) in a fixed script, each
 * call busy for a few milliseconds, and opens /dev/null with openat(AT_FDCWD...) COUNT times. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

/* Busy for at least ``ms`` ms of CLOCK_MONOTONIC, compared in ns: a millisecond count made of
 * (tv_nsec - t0.tv_nsec) / 1000000 rounds a negative difference (a second boundary crossed) toward zero and ended
 * up to 1 ms early (a run measured a 10 ms call at 9.016 ms). */
static void busy_ms(int ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 1000; i++)
            sink += (unsigned long)i * 7u;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ms * 1000000L);
}

__attribute__((noinline)) int process_batch(int batch_size, const char *model)
{
    busy_ms(batch_size > 0 ? batch_size / 4 + 2 : 2);
    sink += strlen(model);
    return batch_size * 2 + 1;
}

int main(int argc, char **argv)
{
    int opens = argc > 1 ? 5 : 0;
    char line[16];
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    static const int sizes[] = {8, 32, -3};
    static const char *models[] = {"resnet50", "bert-large-uncased", "a-model-name-longer-than-sixteen-bytes"};
    for (int i = 0; i < 3; i++)
        printf("process_batch rc=%d\n", process_batch(sizes[i], models[i]));
    for (int i = 0; i < opens; i++) {
        int fd = openat(AT_FDCWD, "/dev/null", O_RDONLY);
        if (fd >= 0)
            close(fd);
    }
    fflush(stdout);
    return 0;
}
