package driver

import (
	"strconv"
	"strings"
)

// signals are the POSIX signals a Killer accepts, by their Linux numbers.
var signals = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7,
	"FPE": 8, "KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13,
	"ALRM": 14, "TERM": 15, "STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19,
	"TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25,
	"VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31,
}

// ParseSignal reads a signal given to Killer.Kill: a name with or without
// the SIG prefix in any case ("TERM", "sigkill") or a number ("9"). It
// returns the canonical name without the prefix ("KILL") and the Linux
// number; anything else is a *FieldError for "signal".
func ParseSignal(s string) (name string, number int, err error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if n, convErr := strconv.Atoi(t); convErr == nil {
		for name, num := range signals {
			if num == n {
				return name, num, nil
			}
		}
		return "", 0, &FieldError{Path: "signal", Reason: strconv.Quote(s) + ": no such signal number"}
	}
	t = strings.TrimPrefix(t, "SIG")
	if n, ok := signals[t]; ok {
		return t, n, nil
	}
	return "", 0, &FieldError{Path: "signal", Reason: strconv.Quote(s) + ": want a signal name such as TERM or KILL, or its number"}
}
