package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// cronField describes one field of a cron expression.
type cronField struct {
	name     string
	min, max int
	names    map[string]int
}

var cronFields = [5]cronField{
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, names: map[string]int{
		"JAN": 1, "FEB": 2, "MAR": 3, "APR": 4, "MAY": 5, "JUN": 6,
		"JUL": 7, "AUG": 8, "SEP": 9, "OCT": 10, "NOV": 11, "DEC": 12,
	}},
	{name: "day-of-week", min: 0, max: 6, names: map[string]int{
		"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6,
	}},
}

// cronDescriptors are the shorthands gocron accepts besides five fields.
var cronDescriptors = map[string]bool{
	"@yearly": true, "@annually": true, "@monthly": true, "@weekly": true,
	"@daily": true, "@midnight": true, "@hourly": true,
}

// checkCron reports whether expr is a standard five-field cron expression
// (minute hour day-of-month month day-of-week) or one of the descriptors
// @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly. Each
// field is a comma-separated list of *, N, N-M, */S, N/S or N-M/S; months and
// weekdays may be written as JAN..DEC and SUN..SAT, in any case.
func checkCron(expr string) error {
	if strings.HasPrefix(expr, "@") {
		switch {
		case cronDescriptors[expr]:
			return nil
		case strings.HasPrefix(expr, "@every"):
			return errors.New("@every is not supported here: use every: instead of cron:")
		}
		return fmt.Errorf("unknown descriptor %q", expr)
	}
	fields := strings.Fields(expr)
	if len(fields) != 5 {
		return fmt.Errorf("want 5 fields (minute hour day-of-month month day-of-week), got %d in %q", len(fields), expr)
	}
	var sets [5][]bool
	for i, f := range fields {
		set, err := cronFields[i].expand(f)
		if err != nil {
			return fmt.Errorf("%s field %q: %w", cronFields[i].name, f, err)
		}
		sets[i] = set
	}
	// With the day of the week unrestricted, the day of the month alone
	// picks the days (a restricted day of the week would add its own), and
	// it may name no day that its months have: 31 in February, say, which
	// the scheduler refuses when it starts.
	if dow := fields[4]; dow == "*" || dow == "*/1" {
		if !someDayExists(sets[2], sets[3]) {
			return fmt.Errorf("%q never fires: no month it names has the days of the month it names", expr)
		}
	}
	return nil
}

// daysIn is the most days each month has (February in a leap year).
var daysIn = [13]int{1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}

// someDayExists reports whether a day in days (by day of the month) falls
// in one of months.
func someDayExists(days, months []bool) bool {
	for m := 1; m <= 12; m++ {
		if !months[m] {
			continue
		}
		for d := 1; d <= daysIn[m]; d++ {
			if days[d] {
				return true
			}
		}
	}
	return false
}

// expand validates one field and returns the values it selects, indexed
// by value (max+1 long).
func (cf cronField) expand(field string) ([]bool, error) {
	set := make([]bool, cf.max+1)
	for _, part := range strings.Split(field, ",") {
		rng, stepText, hasStep := strings.Cut(part, "/")
		step := 1
		if hasStep {
			n, err := cf.number(stepText)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("bad step %q", stepText)
			}
			step = n
		}
		a, b := cf.min, cf.max
		if rng != "*" {
			lo, hi, isRange := strings.Cut(rng, "-")
			var err error
			if a, err = cf.value(lo); err != nil {
				return nil, err
			}
			switch {
			case isRange:
				if b, err = cf.value(hi); err != nil {
					return nil, err
				}
				if a > b {
					return nil, fmt.Errorf("range %s-%s goes backwards", lo, hi)
				}
			case !hasStep:
				b = a // N alone; N/S runs to the field's max
			}
		}
		for v := a; v <= b; v += step {
			set[v] = true
		}
	}
	return set, nil
}

// value parses a number or name within the field's range.
func (cf cronField) value(s string) (int, error) {
	if n, ok := cf.names[strings.ToUpper(s)]; ok {
		return n, nil
	}
	n, err := cf.number(s)
	if err != nil {
		return 0, fmt.Errorf("bad value %q", s)
	}
	if n < cf.min || n > cf.max {
		if cf.name == "day-of-week" && n == 7 {
			// System cron takes 7 for Sunday too; the scheduler does not.
			return 0, fmt.Errorf("%d is out of range %d-%d (Sunday is 0 or SUN)", n, cf.min, cf.max)
		}
		return 0, fmt.Errorf("%d is out of range %d-%d", n, cf.min, cf.max)
	}
	return n, nil
}

// number parses an unsigned decimal number.
func (cronField) number(s string) (int, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, errors.New("not a number")
	}
	return strconv.Atoi(s)
}
