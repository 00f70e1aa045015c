package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux configuration in practice).
const clockTick = 10 * time.Millisecond

// procStatus returns a field of /proc/PID/status in kB, e.g. VmHWM (the
// peak resident set size).
func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		v := strings.Fields(rest)
		if len(v) == 0 {
			break
		}
		return strconv.ParseInt(v[0], 10, 64)
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// cpuTime returns the CPU time (user + system, all threads) a process has
// used so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after it
	// start at field 3 (state): utime is field 14, stime field 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// allowedCPUs returns the CPUs this process may run on, from
// Cpus_allowed_list in /proc/self/status (e.g. "0-1,4").
func allowedCPUs() []int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != "Cpus_allowed_list" {
			continue
		}
		var cpus []int
		for part := range strings.SplitSeq(strings.TrimSpace(rest), ",") {
			lo, hi, isRange := strings.Cut(part, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil
			}
			z := a
			if isRange {
				if z, err = strconv.Atoi(hi); err != nil {
					return nil
				}
			}
			for c := a; c <= z; c++ {
				cpus = append(cpus, c)
			}
		}
		return cpus
	}
	return nil
}

// pinning is where the processes run: Caddy alone on one CPU, the load
// generator and Redis on another. Empty CPU strings mean no pinning.
type pinning struct {
	taskset   string // path of taskset, when pinning
	caddyCPU  string // Caddy's CPU number, as taskset takes it
	loadCPU   string // the CPU number of wrk and redis-server
	reasonOff string // why nothing is pinned, when it is not
}

func choosePinning(disabled bool) pinning {
	if disabled {
		return pinning{reasonOff: "disabled by -pin=false"}
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return pinning{reasonOff: "taskset not found"}
	}
	cpus := allowedCPUs()
	if len(cpus) < 2 {
		return pinning{reasonOff: fmt.Sprintf("only %d CPU available", len(cpus))}
	}
	return pinning{taskset: ts, caddyCPU: strconv.Itoa(cpus[0]), loadCPU: strconv.Itoa(cpus[1])}
}

func (p pinning) on() bool { return p.taskset != "" }

// command returns the command line that runs name with args on cpu.
func (p pinning) command(cpu, name string, args ...string) *exec.Cmd {
	if !p.on() {
		return exec.Command(name, args...)
	}
	return exec.Command(p.taskset, append([]string{"-c", cpu, name}, args...)...)
}

// pinPID moves a running process (all its threads) to cpu.
func (p pinning) pinPID(cpu string, pid int) error {
	if !p.on() {
		return nil
	}
	out, err := exec.Command(p.taskset, "-a", "-p", "-c", cpu, strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("taskset -a -p -c %s %d: %v: %s", cpu, pid, err, out)
	}
	return nil
}

func (p pinning) String() string {
	if !p.on() {
		return "not pinned (" + p.reasonOff + ")"
	}
	return fmt.Sprintf("Caddy pinned to CPU %s; wrk and redis-server pinned to CPU %s (taskset)", p.caddyCPU, p.loadCPU)
}

// machine describes the host for the report.
type machine struct {
	NumCPU    int
	Allowed   string // the CPUs the benchmark may use, from nproc
	CPUModel  string
	GoVersion string
	Kernel    string
	LoadAvg   string // the 1, 5 and 15 minute load averages at start
	Wrk       string // wrk's version
	Redis     string // redis-server's version
	Code      string // the commit measured, and whether the tree had changes
}

func describeMachine() machine {
	m := machine{NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(), CPUModel: "unknown"}
	if out, err := exec.Command("nproc").Output(); err == nil {
		m.Allowed = strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if out, err := exec.Command("wrk", "-v").CombinedOutput(); err == nil || len(out) > 0 {
		m.Wrk, _, _ = strings.Cut(strings.TrimSpace(string(out)), " Copyright")
	}
	m.Code = "unknown"
	if out, err := exec.Command("git", "-C", localfleet.RepoRoot(), "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Code = "commit " + strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "-C", localfleet.RepoRoot(), "status", "--porcelain").Output(); err == nil {
			if lines := strings.TrimSpace(string(st)); lines != "" {
				n := strings.Count(lines, "\n") + 1
				m.Code += fmt.Sprintf(" with uncommitted changes (%d paths)", n)
			}
		}
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		m.Redis = strings.TrimSpace(string(out))
		if f := strings.Fields(m.Redis); len(f) >= 3 {
			m.Redis = "redis-server " + strings.TrimPrefix(f[2], "v=")
		}
	}
	return m
}

// cpuStat is one CPU's line of /proc/stat, in clock ticks.
type cpuStat struct {
	idle  int64 // idle and iowait
	steal int64
	total int64 // all of user, nice, system, idle, iowait, irq, softirq, steal
}

// readCPUStat reads the line of one CPU ("0", "1", ...) or, for "", of all
// CPUs together.
func readCPUStat(cpu string) (cpuStat, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}, err
	}
	name := "cpu" + cpu
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != name {
			continue
		}
		var st cpuStat
		for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return cpuStat{}, fmt.Errorf("/proc/stat: %q: %v", line, err)
			}
			st.total += n
			switch i {
			case 3, 4:
				st.idle += n
			case 7:
				st.steal = n
			}
		}
		return st, nil
	}
	return cpuStat{}, fmt.Errorf("/proc/stat has no %s line", name)
}

// window is the wall time between two readings of one CPU, in seconds.
func window(a, b cpuStat) float64 {
	return float64(b.total-a.total) * clockTick.Seconds()
}

// busyPct is the share of the time between two readings in which the CPU
// ran something (steal excluded).
func busyPct(a, b cpuStat) float64 {
	if b.total <= a.total {
		return 0
	}
	return 100 * float64((b.total-a.total)-(b.idle-a.idle)-(b.steal-a.steal)) / float64(b.total-a.total)
}

// stealPct is the share of the CPU's time between two readings that the
// hypervisor gave to someone else.
func stealPct(a, b cpuStat) float64 {
	if b.total <= a.total {
		return 0
	}
	return 100 * float64(b.steal-a.steal) / float64(b.total-a.total)
}
