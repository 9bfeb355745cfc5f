#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static long tlb(){FILE*f=fopen("/proc/interrupts","r");char b[512];long s=0;while(fgets(b,512,f)){if(strstr(b,"TLB")){char*p=strchr(b,':')+1;for(int i=0;i<2;i++)s+=strtol(p,&p,10);}}fclose(f);return s;}
int main(int c,char**v){int fd=open(v[1],O_RDONLY);struct stat st;fstat(fd,&st);size_t n=st.st_size&~4095UL; int mode=atoi(v[2]);
 posix_fadvise(fd,0,n,POSIX_FADV_DONTNEED);
 char*p=mmap(0,n,PROT_READ,MAP_PRIVATE,fd,0);
 if(mode==0){ size_t W=4<<20; madvise(p,n,MADV_RANDOM); madvise(p,W,MADV_WILLNEED);
    for(size_t o=0;o<n;o+=W){ size_t k=n-o<W?n-o:W; if(o+k<n) madvise(p+o+k,(n-o-k)<W?(n-o-k):W,MADV_WILLNEED); madvise(p+o,k,22);} }
 else { madvise(p,n,MADV_NORMAL); madvise(p,n,MADV_WILLNEED); madvise(p,n,22);}
 double ts[40]; long t0=tlb(); double T0=now();
 for(int r=0;r<40;r++){ double t=now(); uint64_t s=0; for(size_t i=0;i<n;i+=64) s+=*(volatile uint64_t*)(p+i); ts[r]=now()-t; if(s==42)puts("");}
 long t1=tlb(); double T=now()-T0;
 for(int i=0;i<40;i++)for(int j=i+1;j<40;j++)if(ts[j]<ts[i]){double x=ts[i];ts[i]=ts[j];ts[j]=x;}
 printf("mode %d: 40 scans %.2f s, median %.4f min %.4f max %.4f, TLB shootdowns %ld\n",mode,T,ts[20],ts[0],ts[39],t1-t0);
 system("grep FileHugePages /proc/meminfo");
}
