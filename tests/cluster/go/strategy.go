package main

// The registry strategies of the built-in kinds. They are deliberately minimal: they
// do what the generic registry needs to store an object the way kube-apiserver stores it
// (scope, generation of workloads, status kept apart from the rest of the object by the status
// subresource, status cleared on create where kube-apiserver clears it), and nothing
// else. They are not validators: the validation and defaulting of built-in types live in
// k8s.io/kubernetes (pkg/apis/*/validation, pkg/apis/*/v1/defaults.go), which Debian does
// not package, and writing our own would be a second, drifting copy of them. Object
// metadata is still validated by the generic registry (rest.BeforeCreate/BeforeUpdate).

import (
	"context"
	"reflect"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// strategy is the create/update/delete strategy of one built-in resource.
type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	res *resource
}

func newStrategy(typer runtime.ObjectTyper, res *resource) strategy {
	return strategy{ObjectTyper: typer, NameGenerator: names.SimpleNameGenerator, res: res}
}

func (s strategy) NamespaceScoped() bool { return s.res.namespaced }

// PrepareForCreate clears the status where kube-apiserver does (its strategies' own
// PrepareForCreate), applies the resource's creation hook, and starts the generation.
func (s strategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	if s.res.status && s.res.clearStatusOnCreate {
		if st := structField(obj, "Status"); st.IsValid() {
			st.Set(reflect.Zero(st.Type()))
		}
	}
	if s.res.onCreate != nil {
		s.res.onCreate(obj)
	}
	if s.res.generation {
		if m, err := meta.Accessor(obj); err == nil {
			m.SetGeneration(1)
		}
	}
}

// PrepareForUpdate keeps the stored status (a write of the main resource never changes
// it when the kind has a status subresource) and bumps the generation when the spec
// changed.
func (s strategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	if s.res.status {
		if st := structField(obj, "Status"); st.IsValid() {
			st.Set(structField(old, "Status"))
		}
	}
	if s.res.onUpdate != nil {
		s.res.onUpdate(obj, old)
	}
	if !s.res.generation {
		return
	}
	newSpec, oldSpec := structField(obj, "Spec"), structField(old, "Spec")
	newMeta, err1 := meta.Accessor(obj)
	oldMeta, err2 := meta.Accessor(old)
	if err1 != nil || err2 != nil {
		return
	}
	generation := oldMeta.GetGeneration()
	if !equality.Semantic.DeepEqual(newSpec.Interface(), oldSpec.Interface()) {
		generation++
	}
	newMeta.SetGeneration(generation)
}

// Validate does nothing: see the file comment.
func (strategy) Validate(context.Context, runtime.Object) field.ErrorList { return nil }

// ValidateUpdate does nothing: see the file comment.
func (strategy) ValidateUpdate(context.Context, runtime.Object, runtime.Object) field.ErrorList {
	return nil
}

func (strategy) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }

func (strategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}

func (strategy) Canonicalize(runtime.Object) {}

func (s strategy) AllowCreateOnUpdate() bool { return s.res.createOnUpdate }

func (strategy) AllowUnconditionalUpdate() bool { return true }

// GetResetFields: with a status subresource, a server-side apply of the main resource
// never owns status fields.
func (s strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	if !s.res.status {
		return nil
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.res.gv.String()): fieldpath.NewSet(fieldpath.MakePathOrDie("status")),
	}
}

// statusStrategy is the strategy of the status subresource: only the status (and the
// managed fields that record who wrote it) changes.
type statusStrategy struct{ strategy }

func (s statusStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	nv, ov := reflect.ValueOf(obj).Elem(), reflect.ValueOf(old).Elem()
	for i := 0; i < nv.NumField(); i++ {
		switch nv.Type().Field(i).Name {
		case "TypeMeta", "ObjectMeta", "Status":
		default:
			nv.Field(i).Set(ov.Field(i))
		}
	}
	newMeta, err1 := meta.Accessor(obj)
	oldMeta, err2 := meta.Accessor(old)
	if err1 == nil && err2 == nil {
		metav1.ResetObjectMetaForStatus(newMeta, oldMeta)
	}
	if s.res.onStatusUpdate != nil {
		s.res.onStatusUpdate(obj, old)
	}
}

func (s statusStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	set := fieldpath.NewSet()
	if structField(s.res.newObj(), "Spec").IsValid() {
		set.Insert(fieldpath.MakePathOrDie("spec"))
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{fieldpath.APIVersion(s.res.gv.String()): set}
}

// structField is the named field of the struct obj points to, or the zero Value.
func structField(obj runtime.Object, name string) reflect.Value {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return reflect.Value{}
	}
	return v.Elem().FieldByName(name)
}
