package sim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/backstop-sync/backstop"
)

// timeLayout is the platform's timestamp form: RFC 3339, UTC, microseconds.
const timeLayout = "2006-01-02T15:04:05.000000Z"

func formatTS(ns int64) string { return time.Unix(0, ns).UTC().Format(timeLayout) }

// seedSpan bounds the updated_at range of the seed data after BaseTime.
const seedSpan = 30 * 24 * time.Hour

// equalRun is the chance that a seed object shares the previous object's
// updated_at.
const equalRun = 0.3

// bigText is the minimum length in bytes of a big message's text.
const bigText = 70 << 10

type contact struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Email     string `json:"email"`
	Phone     string `json:"phone"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
}

type chat struct {
	ID        string `json:"id"`
	ContactID string `json:"contact_id"`
	Channel   string `json:"channel"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
}

type message struct {
	ID        string `json:"id"`
	ChatID    string `json:"chat_id"`
	Direction string `json:"direction"`
	Text      string `json:"text"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
}

type payment struct {
	ID        string `json:"id"`
	ContactID string `json:"contact_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
}

var (
	names = []struct{ display, login string }{
		{"Иван Петров", "ivan.petrov"}, {"Анна Смирнова", "anna.smirnova"},
		{"Ольга Кузнецова", "olga.kuznetsova"}, {"Дмитрий Соколов", "dmitry.sokolov"},
		{"Мария Попова", "maria.popova"}, {"Сергей Лебедев", "sergey.lebedev"},
		{"Наталья Козлова", "natalya.kozlova"}, {"Пётр Волков", "petr.volkov"},
		{"Айгерім Сәрсенова", "aigerim.sarsenova"}, {"Łukasz Wójcik", "lukasz.wojcik"},
		{"Zofia Żółkiewska", "zofia.zolkiewska"}, {"Małgorzata Łęcka", "malgorzata.lecka"},
		{"Paweł Dąbrowski", "pawel.dabrowski"}, {"Grzegorz Brzęczyszczykiewicz", "grzegorz.b"},
		{"Jędrzej Śliwiński", "jedrzej.sliwinski"}, {"Ewa Szczęsna", "ewa.szczesna"},
		{"王伟", "wang.wei"}, {"李娜", "li.na"}, {"山田太郎", "yamada.taro"},
		{"佐藤花子", "sato.hanako"}, {"김민준", "kim.minjun"}, {"John Smith", "john.smith"},
		{"Emma Müller", "emma.muller"}, {"José Álvarez", "jose.alvarez"},
		{"Zoë O'Brien", "zoe.obrien"},
	}
	nameSuffixes = []string{" 🌸", " 🚀", " ⭐", " 👩‍💻", " 🇵🇱", " (VIP)"}
	domains      = []string{"example.com", "example.org", "example.net", "mail.example"}
	channels     = []string{"whatsapp", "telegram", "instagram", "web"}
	currencies   = []string{"RUB", "PLN", "EUR", "USD", "KZT"}
	phrases      = []string{
		"Здравствуйте! Когда будет доставка?",
		"Спасибо, всё получили 👍",
		"Оплатил, проверьте, пожалуйста 🙏",
		"Съешь же ещё этих мягких французских булок, да выпей чаю.",
		"Dzień dobry, czy mogę zmienić zamówienie?",
		"Zażółć gęślą jaźń.",
		"Proszę o fakturę VAT.",
		"Łódź → Kraków, ile to kosztuje?",
		"こんにちは、注文の状況を教えてください。",
		"你好，我想退款。",
		"안녕하세요! 배송은 언제 되나요?",
		"Hello, is the store open on Sunday?",
		"👋😀🎉",
		"Line one\nline two\t\"quoted\" <b>html</b> & ampersand \\ backslash",
	}
	editMarks = []string{" (изм.)", " (edytowano)", " (edited)", " ✏️"}
)

const idAlphabet = "0123456789abcdefghijklmnopqrstuvwxyz"

// generator makes objects and mutations from one seeded random source.
// It is not safe for concurrent use; the Sim calls it under its lock.
type generator struct {
	rng      *rand.Rand
	ids      map[string]bool
	contacts []string // every contact id issued, for references
	chats    []string // every chat id issued, for references
}

func newGenerator(seed int64) *generator {
	return &generator{
		rng: rand.New(rand.NewPCG(uint64(seed), 0x6261636b73746f70)),
		ids: make(map[string]bool),
	}
}

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

func (g *generator) newID(r backstop.Resource) string {
	var b strings.Builder
	for {
		b.Reset()
		b.WriteString(r.IDPrefix())
		for range 16 {
			b.WriteByte(idAlphabet[g.rng.IntN(len(idAlphabet))])
		}
		if id := b.String(); !g.ids[id] {
			g.ids[id] = true
			switch r {
			case backstop.Contacts:
				g.contacts = append(g.contacts, id)
			case backstop.Chats:
				g.chats = append(g.chats, id)
			}
			return id
		}
	}
}

// ref returns a random id from ids, or a fresh dangling id of r when there
// is none (a sim started with no objects).
func (g *generator) ref(ids []string, r backstop.Resource) string {
	if len(ids) == 0 {
		return r.IDPrefix() + "0000000000000000"
	}
	return pick(g.rng, ids)
}

// seed returns n objects of r with updated_at from BaseTime on, about
// equalRun of them sharing the previous updated_at. For messages, big of
// them have texts over 64 KiB.
func (g *generator) seed(r backstop.Resource, n, big int) []*record {
	recs := make([]*record, n)
	if n == 0 {
		return recs
	}
	// Steps average 80% of the span over n objects; the clamp only bites
	// for tiny n.
	avg := int64(seedSpan/time.Microsecond) / int64(n)
	maxStep := max(2*avg*8/7, 1)
	t := BaseTime.UnixMicro()
	end := BaseTime.Add(seedSpan).UnixMicro()
	isBig := make(map[int]bool)
	if r == backstop.Messages {
		for _, i := range g.rng.Perm(n)[:min(big, n)] {
			isBig[i] = true
		}
	}
	for i := range recs {
		if i == 0 || g.rng.Float64() >= equalRun {
			t = min(t+1+g.rng.Int64N(maxStep), end)
		}
		ts := t * int64(time.Microsecond)
		created := ts
		if g.rng.IntN(2) == 0 {
			created -= g.rng.Int64N(int64(7*24*time.Hour/time.Microsecond)) * int64(time.Microsecond)
		}
		recs[i] = g.create(r, ts, created, isBig[i])
	}
	return recs
}

// create makes a new object of r.
func (g *generator) create(r backstop.Resource, ts, created int64, big bool) *record {
	id := g.newID(r)
	c, u := formatTS(created), formatTS(ts)
	var v any
	switch r {
	case backstop.Contacts:
		v = contact{ID: id, Name: g.name(), Email: g.email(), Phone: g.phone(), CreatedAt: c, UpdatedAt: u}
	case backstop.Chats:
		status := "closed"
		if g.rng.IntN(5) < 2 {
			status = "opened"
		}
		v = chat{ID: id, ContactID: g.ref(g.contacts, backstop.Contacts), Channel: pick(g.rng, channels), Status: status, CreatedAt: c, UpdatedAt: u}
	case backstop.Messages:
		dir := "in"
		if g.rng.IntN(2) == 0 {
			dir = "out"
		}
		v = message{ID: id, ChatID: g.ref(g.chats, backstop.Chats), Direction: dir, Text: g.text(big), CreatedAt: c, UpdatedAt: u}
	case backstop.Payments:
		status := "succeeded"
		switch p := g.rng.IntN(100); {
		case p < 15:
			status = "pending"
		case p < 25:
			status = "failed"
		case p < 35:
			status = "refunded"
		}
		v = payment{ID: id, ContactID: g.ref(g.contacts, backstop.Contacts), Amount: 100 + g.rng.Int64N(500_000), Currency: pick(g.rng, currencies), Status: status, CreatedAt: c, UpdatedAt: u}
	default:
		panic("sim: unknown resource " + string(r))
	}
	return &record{id: id, ts: ts, v: v, data: encode(v)}
}

func (g *generator) name() string {
	n := pick(g.rng, names).display
	if g.rng.IntN(10) == 0 {
		n += pick(g.rng, nameSuffixes)
	}
	return n
}

func (g *generator) email() string {
	return fmt.Sprintf("%s%d@%s", pick(g.rng, names).login, g.rng.IntN(1000), pick(g.rng, domains))
}

func (g *generator) phone() string {
	switch g.rng.IntN(3) {
	case 0:
		return fmt.Sprintf("+7 9%02d %03d-%02d-%02d", g.rng.IntN(100), g.rng.IntN(1000), g.rng.IntN(100), g.rng.IntN(100))
	case 1:
		return fmt.Sprintf("+48 %03d %03d %03d", 500+g.rng.IntN(300), g.rng.IntN(1000), g.rng.IntN(1000))
	}
	return fmt.Sprintf("+86 1%02d %04d %04d", 30+g.rng.IntN(70), g.rng.IntN(10000), g.rng.IntN(10000))
}

func (g *generator) text(big bool) string {
	var b strings.Builder
	n := 1 + g.rng.IntN(3)
	for i := 0; i < n || (big && b.Len() < bigText); i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(pick(g.rng, phrases))
	}
	return b.String()
}

// mutate makes one mutation at updated_at ts: an update of a random existing
// object or, about 30% of the time (and whenever no object can be updated),
// a new object. It returns the new version; the caller stores it.
func (g *generator) mutate(feeds map[backstop.Resource]*feed, ts int64) (backstop.Resource, *record) {
	r := backstop.Resources[g.rng.IntN(len(backstop.Resources))]
	f := feeds[r]
	if len(f.recs) > 0 && g.rng.Float64() >= 0.3 {
		// A few tries to find a payment that can still change status.
		for range 8 {
			if rec := g.update(f.recs[g.rng.IntN(len(f.recs))], ts); rec != nil {
				return r, rec
			}
		}
	}
	return r, g.create(r, ts, ts, false)
}

// update returns the next version of old at ts, or nil when old cannot
// change (a payment in a final status).
func (g *generator) update(old *record, ts int64) *record {
	u := formatTS(ts)
	var v any
	switch o := old.v.(type) {
	case contact:
		if g.rng.IntN(2) == 0 {
			o.Name = g.name()
		} else {
			o.Phone = g.phone()
		}
		o.UpdatedAt = u
		v = o
	case chat:
		if o.Status == "opened" {
			o.Status = "closed"
		} else {
			o.Status = "opened"
		}
		o.UpdatedAt = u
		v = o
	case message:
		if len(o.Text) < bigText && g.rng.IntN(2) == 0 {
			o.Text = g.text(false)
		} else {
			o.Text += pick(g.rng, editMarks)
		}
		o.UpdatedAt = u
		v = o
	case payment:
		switch o.Status {
		case "pending":
			o.Status = "succeeded"
			if g.rng.IntN(4) == 0 {
				o.Status = "failed"
			}
		case "succeeded":
			o.Status = "refunded"
		default:
			return nil
		}
		o.UpdatedAt = u
		v = o
	default:
		panic(fmt.Sprintf("sim: unknown object %T", old.v))
	}
	return &record{id: old.id, ts: ts, v: v, data: encode(v)}
}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sim: encode object: " + err.Error())
	}
	return b
}
