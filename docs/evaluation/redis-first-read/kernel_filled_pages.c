#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// Pages filled only by the kernel (read() into fresh anonymous memory) against pages touched by user
// space first: the time of the first and second user-mode read of each (docs/fleet.md, "Why TLS
// read faster"). gcc -O2 -o kernel_filled_pages kernel_filled_pages.c && ./kernel_filled_pages
// fill buf of n bytes from /dev/zero with read() (the kernel writes the pages)
static void kfill(char*b,size_t n){int fd=open("/dev/zero",O_RDONLY);size_t h=0;while(h<n){ssize_t r=read(fd,b+h,n-h>(1<<20)?(1<<20):n-h);h+=r;}close(fd);}
static double readall(char*b,size_t n,char*dst){double t=now();for(size_t o=0;o<n;o+=1<<20){memcpy(dst,b+o,1<<20);__asm__ volatile("" ::"r"(dst):"memory");}return now()-t;}
int main(){size_t n=256u<<20;char*dst=malloc(1<<20);memset(dst,1,1<<20);
 for(int round=0;round<2;round++){
 char*a=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 char*b=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 double t0=now();memset(a,0,n);kfill(a,n);double ta=now()-t0;
 t0=now();kfill(b,n);double tb=now()-t0;
 double ra1=readall(a,n,dst),rb1=readall(b,n,dst),ra2=readall(a,n,dst),rb2=readall(b,n,dst);
 printf("256 MiB: user-touched then read(): fill %.0f ms, 1st user read %.0f ms, 2nd %.0f ms | only read() by the kernel: fill %.0f ms, 1st user read %.0f ms, 2nd %.0f ms\n",ta*1e3,ra1*1e3,ra2*1e3,tb*1e3,rb1*1e3,rb2*1e3);
 munmap(a,n);munmap(b,n);}
 return 0;}
