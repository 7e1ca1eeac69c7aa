/*
 * fdutil: finding, through /proc/self/fd, the unnamed files this process holds (the NVMe
 * tier's state files are made with O_TMPFILE), so that a test can damage one the way a bad
 * disk would.  Linux only.
 */
#ifndef ZS_TEST_FDUTIL_H
#define ZS_TEST_FDUTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The nth (from 0) unnamed file in directory dir that this process holds open, opened again
 * for reading and writing; -1 when there is no such file. */
static inline int zs_test_open_unnamed(const char *dir, int nth)
{
    DIR *d = opendir("/proc/self/fd");
    int fd = -1, seen = 0;
    struct dirent *de;
    while (d && fd < 0 && (de = readdir(d)) != NULL) {
        char link[600], path[300];
        snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = 0;
        if (strncmp(link, dir, strlen(dir)) == 0 && strstr(link, "(deleted)") && seen++ == nth)
            fd = open(path, O_RDWR);
    }
    if (d)
        closedir(d);
    return fd;
}

#endif
